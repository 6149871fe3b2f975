#include "config/deck_broadcast.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>

#include "deck/schema.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {

Deck load_deck_collective(MPI_Comm comm, const std::string& path,
                          const std::vector<std::string>& overrides) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int status = 0;
  std::string payload;
  if (rank == 0) {
    try {
      payload = load_deck(path, overrides).to_json();
    } catch (const Error& e) {
      status = 1;
      payload = e.what();
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, comm);
  broadcast_string(comm, payload, 0);
  if (status != 0) SLIMPI_FAIL_ALL("{}", payload);
  Deck deck = Deck::from_json(payload);
  validate_deck(deck);
  return deck;
}

void validate_deck(const Deck& deck) {
  std::vector<std::string> problems;
  for (const auto& spec : Schema::instance().keys())
    if (!deck.entries().count(spec.key)) problems.push_back("missing key " + spec.key);
  for (const auto& [key, entry] : deck.entries()) {
    const KeySpec* spec = Schema::instance().find(key);
    if (!spec) {
      problems.push_back("unknown key " + key);
      continue;
    }
    DeckValue value = entry.value;
    if (auto problem = check_deck_value(*spec, value)) problems.push_back(entry.source + ": " + *problem);
  }
  if (!problems.empty())
    SLIMPI_FAIL_ALL("resolved deck is inconsistent with this binary's schema: {}", fmt::join(problems, "; "));
}

}  // namespace slimpi
