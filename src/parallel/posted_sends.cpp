#include "parallel/posted_sends.h"

#include <chrono>
#include <thread>

#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {

PostedSends::~PostedSends() {
  // Only an error leaves sends in flight: their buffers must outlive them, so they are
  // left allocated (the job is ending) rather than freed under MPI's feet.
  for (auto& s : sends_) (void)s.release();
}

void PostedSends::post(std::string bytes, int dest, int tag) {
  auto out = std::make_unique<Outgoing>(Outgoing{std::move(bytes), MPI_REQUEST_NULL});
  check_mpi(MPI_Isend(out->bytes.data(), message_count(out->bytes.size(), dest, tag), MPI_BYTE, dest, tag, comm_,
                      &out->request),
            "MPI_Isend");
  sends_.push_back(std::move(out));
}

void PostedSends::reap() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    check_mpi(MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    it = done ? sends_.erase(it) : std::next(it);
  }
}

void PostedSends::flush() {
  reap();
  if (sends_.empty()) return;
  WaitGuard guard({&context_, "MPI_Test (asleep between tests)"});
  auto nap = std::chrono::microseconds(50);
  while (!sends_.empty()) {
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
    reap();
  }
}

}  // namespace slimpi
