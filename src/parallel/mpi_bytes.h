// Small MPI helpers for byte strings and error checking, used by every MPI caller.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace slimpi {

// Throws slimpi::Error with MPI's error text when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* what);

// Broadcasts a string of any length from `root` (length first, then the bytes).
void broadcast_string(MPI_Comm comm, std::string& text, int root);

// Point-to-point messages of any size (< 2 GiB) as byte strings. recv_message probes
// for the size first, asleep between probes as await_message is (a waiting rank leaves
// its core to the ranks that work), under the watchdog with `context` naming the wait;
// `source` may be MPI_ANY_SOURCE.
void send_message(MPI_Comm comm, const std::string& bytes, int dest, int tag);
// The count of a byte message of `n` bytes to `dest` (throws, naming them, past 2 GiB - 1).
int message_count(size_t n, int dest, int tag);
std::string recv_message(MPI_Comm comm, int source, int tag, const std::string& context);

// int64 values as a message's bytes (same binary on both ends), and back.
std::string int64_bytes(const std::vector<int64_t>& values);
std::vector<int64_t> int64_values(const std::string& bytes);

// Whether a message from `source` (or MPI_ANY_SOURCE) with `tag` is there to receive.
bool message_waiting(MPI_Comm comm, int source, int tag);
// Sleeps (growing naps up to 1 ms, under the watchdog with `context`) until one is: a
// rank waiting for work leaves its core to the ranks that work.
void await_message(MPI_Comm comm, int source, int tag, const std::string& context);
// The same for a message with any of `tags`: returns the tag of one that is waiting (the
// first of `tags` when several are).
int await_any_message(MPI_Comm comm, int source, const std::vector<int>& tags, const std::string& context);

}  // namespace slimpi

namespace slimpi {

// A barrier that sleeps while it waits: MPI_Ibarrier, then MPI_Test with a short spin
// and growing sleeps (up to 1 ms). Placed where one side of the job waits for the
// other to finish a long phase (trainers for rollouts, engines for training), so a
// waiting rank leaves its core to the ranks that work - blocking MPI calls spin, and
// on an oversubscribed node the spinning steals the workers' cores.
void idle_barrier(MPI_Comm comm, const std::string& what);

// Runs `body` on every rank of `comm` (each rank decides inside what it has to do),
// then agrees: if any rank's body threw, every rank throws one collective
// slimpi::Error "<context>: <the lowest failing rank's message> (rank r)". For work
// where one rank's failure (a full disk) must stop all ranks cleanly, not abort them.
void run_on_all_and_agree(MPI_Comm comm, const std::string& context, const std::function<void()>& body);

}  // namespace slimpi
