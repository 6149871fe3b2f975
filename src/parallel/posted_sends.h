// PostedSends — point-to-point byte messages sent without blocking: each is posted
// (MPI_Isend) and completed later while the sender goes on receiving, so two ranks that
// send to each other at once never wait on each other (a large message waits for its
// receive). The buffers stay put until their send completes.
// Owned by one router; single-threaded.
#pragma once

#include <mpi.h>

#include <deque>
#include <memory>
#include <string>

namespace slimpi {

class PostedSends {
 public:
  // context: names the wait of flush() for the watchdog.
  PostedSends(MPI_Comm comm, std::string context) : comm_(comm), context_(std::move(context)) {}
  ~PostedSends();
  PostedSends(const PostedSends&) = delete;
  PostedSends& operator=(const PostedSends&) = delete;

  void post(std::string bytes, int dest, int tag);
  // Drops the sends that have completed.
  void reap();
  // Waits (asleep between tests, under the watchdog) until every send has completed.
  void flush();

 private:
  struct Outgoing {
    std::string bytes;
    MPI_Request request;
  };
  MPI_Comm comm_;
  std::string context_;
  std::deque<std::unique_ptr<Outgoing>> sends_;  // posted, not yet complete
};

}  // namespace slimpi
