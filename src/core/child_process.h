// ChildProcess — an external command (/bin/sh -c COMMAND) with pipes to its stdin and
// stdout (and, when asked, its stderr), that cannot outlive the rank that started it.
//
// Role: reward commands (reward/command_reward.h) and, later, environment processes
// run through it. Owner: the caller; the destructor kills and reaps the whole process
// group, whatever the outcome of the call.
//
// How nothing is left behind however the rank ends (return, exception, the watchdog's
// _Exit, MPI_Abort, SIGKILL from mpirun or the user): the command (`sh -c COMMAND`)
// leads a new process group G, and a watcher (`sh -c 'read -r _; kill -KILL 0'`) joins
// G reading a "lifeline" pipe whose only write end is the rank's. When the rank dies in
// any way the kernel closes that end, the watcher's read ends and it kills group G (the
// command, its children, itself). The rank waits for the command itself, so it sees the
// command's own exit status. The command also has PR_SET_PDEATHSIG. A descendant that
// leaves group G on purpose (setsid, setpgid) escapes; nothing else does. Both children
// are `sh` at once (exec right after vfork): no copy of the rank lingers under its name,
// and none of its page tables is copied. Between vfork and exec the children make only
// system calls (async-signal-safe, writing nothing of the rank's memory): the rank
// has threads (OpenMP, MPI progress), so nothing else is safe there.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class ChildProcess {
 public:
  // Starts `command`; throws slimpi::Error when pipes or fork fail. capture_stderr: the
  // command's stderr goes to a pipe the caller reads (stderr_fd) instead of the rank's.
  // extra_env: "NAME=value" entries the command gets on top of the rank's environment
  // (replacing the rank's value of the same NAME); "PREFIX*" drops the rank's variables
  // whose names start with PREFIX.
  explicit ChildProcess(const std::string& command, bool capture_stderr = false,
                        const std::vector<std::string>& extra_env = {});
  ~ChildProcess();  // closes the pipes, kills group G, reaps the command and the watcher
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }  // the command's shell: also the process group's id
  int stdin_fd() const { return in_; }    // non-blocking; -1 once closed
  int stdout_fd() const { return out_; }  // non-blocking; -1 once closed
  int stderr_fd() const { return err_; }  // non-blocking; -1 when not captured
  void close_stdin();
  void close_stdout();
  void close_stderr();
  // Waits for the command to exit until `deadline`; false on time-out. Sets *status
  // (a waitpid status: the command's exit code or its signal).
  bool wait_until(std::chrono::steady_clock::time_point deadline, int* status);
  // "exit status 3", "killed by signal 11 (Segmentation fault)".
  static std::string describe_status(int status);

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  int err_ = -1;
  pid_t watcher_ = -1;
  int lifeline_ = -1;  // write end; the watcher kills group G when it closes
  bool reaped_ = false;
};

// `command` under sh's rlimits (ulimit -t CPU seconds, -v KiB of address space; 0 = none).
// A simple command (one program and its arguments: no shell operator, redirection,
// substitution or assignment, its first word an executable on PATH or a path) is exec'ed,
// so that the program itself holds the pipes: sh (dash) would otherwise stay as its
// parent holding stdout open, and a program that closes its stdout would be noticed late.
std::string command_under_limits(const std::string& command, double cpu_limit_s, int64_t memory_limit_mb);

}  // namespace slimpi
