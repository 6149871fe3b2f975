// load_deck_collective(): the deck as every rank of an MPI job sees it.
// Rank 0 reads the files and resolves includes/overrides; the resolved deck (or the
// error text) is broadcast; every rank then re-validates the same values, so a bad
// deck stops every rank with the same collective error and no rank waits on another.
#pragma once

#include <mpi.h>

#include <slimpi/deck.h>

namespace slimpi {

Deck load_deck_collective(MPI_Comm comm, const std::string& path,
                          const std::vector<std::string>& overrides);

// Re-checks every value of a deck against the schema (types, ranges, choices, no
// missing or unknown keys); throws a collective slimpi::Error listing the problems.
void validate_deck(const Deck& deck);

}  // namespace slimpi
