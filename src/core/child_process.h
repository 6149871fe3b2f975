// ChildProcess — an external command (/bin/sh -c COMMAND) with pipes to its stdin and
// stdout, that cannot outlive the rank that started it.
//
// Role: reward commands (reward/command_reward.h) and, later, environment processes
// run through it. Owner: the caller; the destructor kills and reaps the whole process
// group, whatever the outcome of the call.
//
// How nothing is left behind however the rank ends (return, exception, the watchdog's
// _Exit, MPI_Abort, SIGKILL from mpirun or the user):
//   rank ──fork──> keeper (leader of a new process group G) ──fork──> sh -c COMMAND (in G)
// The keeper holds the read end of a "lifeline" pipe whose only write end is the
// rank's. When the rank dies in any way the kernel closes that end, the keeper sees
// the hang-up and kills group G (the command, its children, itself). While the rank
// lives, the keeper waits for the command and exits with its status (or dies of its
// signal), so the rank sees the command's own exit status. The command also has
// PR_SET_PDEATHSIG against the keeper. A descendant that leaves group G on purpose
// (setsid, setpgid) escapes; nothing else does.
// Between fork and exec the children call only async-signal-safe functions: the rank
// has threads (OpenMP, MPI progress), so nothing else is safe there.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace slimpi {

class ChildProcess {
 public:
  // Starts `command`; throws slimpi::Error when pipes or fork fail.
  explicit ChildProcess(const std::string& command);
  ~ChildProcess();  // closes the pipes, kills group G, reaps the keeper
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }  // the keeper: also the process group's id
  int stdin_fd() const { return in_; }    // non-blocking; -1 once closed
  int stdout_fd() const { return out_; }  // non-blocking; -1 once closed
  void close_stdin();
  void close_stdout();
  // Waits for the command to exit until `deadline`; false on time-out. Sets *status
  // (a waitpid status: the command's exit code or its signal).
  bool wait_until(std::chrono::steady_clock::time_point deadline, int* status);
  // "exit status 3", "killed by signal 11 (Segmentation fault)".
  static std::string describe_status(int status);

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  int lifeline_ = -1;  // write end; the keeper kills group G when it closes
  bool reaped_ = false;
};

}  // namespace slimpi
