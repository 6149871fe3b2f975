// CommandEnvironment — rollout.environment = "command": rollout.env_processes external
// processes per rollout rank (rollout.env_command through /bin/sh -c, with the CPU and
// memory rlimits of rollout.env_cpu_limit_s and rollout.env_memory_limit_mb), each
// serving up to its max_concurrent_episodes episodes at once over JSON lines
// (env/env_protocol.h). Episodes go to the process with the most room.
//
// Failures end episodes, not the job: a process that exits, writes a line that names no
// episode, or writes a line longer than rollout.env_max_reply_bytes is killed and
// restarted (its own episodes end: those waiting for a reply get a failed reply at
// once, the others at their next step, since their state died with it; with an
// environment that takes snapshots they are brought back instead: each restored from its
// latest snapshot into a process of the new set, its request in flight sent again, or,
// before its first observation, reset again; an episode that was waiting for a reply at
// two of its processes' deaths may be their cause and fails); a reply that
// names its episode but is unusable fails that episode alone; an episode without a
// reply within rollout.env_timeout_s fails alone, and its process is restarted too
// when it has written nothing for that long. A process that fails more than
// rollout.env_max_restarts times, or whose start-up handshake fails, ends the job with
// the reason (that is a broken command, not a bad episode).
// A process's stderr comes through a pipe: its lines go to the job's log prefixed with
// the process, up to rollout.env_max_stderr_bytes per process start, the rest read and
// dropped (one line says so; its last 2 KB are kept), so a chatty or flooding environment
// neither fills the log nor blocks on a full pipe; before a restart the process's last
// lines are logged (its traceback, say), whether or not the cap was reached.
// Built per rollout rank by environments(); owns its processes (core/child_process.h:
// they die with the rank however it ends).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "env/environment.h"

namespace slimpi {

class ChildProcess;
class StderrLog;

class CommandEnvironment : public Environment {
 public:
  CommandEnvironment(const EnvConfig& cfg, int64_t vocab_size);
  ~CommandEnvironment() override;

  const EnvInfo& info() const override { return info_; }
  void reset(const EpisodeStart& start) override;
  void step(const EpisodeAction& action) override;
  void restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot) override;
  void close(const std::string& episode) override;
  std::vector<EnvReply> poll(double wait_s) override;
  int64_t capacity() const override;
  int64_t restarts() const override { return restarts_; }
  void exclude_pause(double seconds) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Process {
    int index = 0;
    std::unique_ptr<ChildProcess> child;
    std::string out_buf;  // bytes written to it, not yet accepted by its stdin
    std::string in_buf;   // bytes read from it, not yet a whole line
    std::set<std::string> episodes;                   // open on it
    std::map<std::string, Clock::time_point> waiting;  // episode -> deadline of its outstanding request
    Clock::time_point last_output;
    int64_t restarts = 0;
    int64_t max_episodes = 1;  // its hello's max_concurrent_episodes
    int64_t unsolicited = 0;   // replies with no request outstanding (dropped)
    std::unique_ptr<StderrLog> err;  // its stderr into the log (core/stderr_log.h)
  };
  // Opens an episode on the process with the most room with its first request (reset or restore).
  void open(const std::string& episode, const std::string& line);
  void start(Process& p);  // spawns and handshakes (throws: the command is broken)
  // Kills and restarts p; its episodes are brought back (bring_back) where they can be, else
  // the waiting ones get failed replies and the others are lost. suspects: the waiting
  // episodes caused it (no reply in time): they are not brought back.
  void restart(Process& p, const std::string& why, bool suspects = false);
  // An open episode's way back after its process died (environments with snapshots): its
  // reset's fields, its latest snapshot and the model turns that snapshot follows, the
  // request in flight.
  struct Recovery {
    EpisodeStart start;
    std::string snapshot;  // "" = none yet
    int64_t snapshot_turns = 0;
    int64_t steps = 0;            // steps sent (the model turns it has been told of)
    std::string in_flight;        // the line of the request awaiting its reply ("" = none)
    int deaths_waiting = 0;       // its process died while it waited for a reply
    bool own_restore = false;     // a restore slimpi sent to bring it back: its reply is slimpi's
    bool runner_awaits_restored = false;  // restore() was called: the runner waits for the restored reply
  };
  // Whether the runner waits for a reply of `episode`: not while slimpi's own restore of an
  // episode whose model is taking its turn is outstanding (that reply is slimpi's).
  bool runner_waits(const std::string& episode) const;
  // A request of `episode` failed or its process died under it: the runner hears now when
  // it waits for a reply, else at the episode's next step (lost_).
  void episode_failed(const std::string& episode, const std::string& why);
  // Whether `episode` comes back after its process died (waiting: a reply was outstanding).
  bool can_bring_back(const std::string& episode, bool waiting, bool suspect);
  void bring_back(const std::string& episode);
  // A reply of an episode with a Recovery: kept up to date; false when the reply is
  // slimpi's own (the restored answer to a restore it sent), not the runner's.
  bool track_reply(Process& p, const EnvReply& reply);
  void send(Process& p, const std::string& episode, const std::string& line, bool expects_reply);
  void flush(Process& p);
  void read_lines(Process& p);
  // p's stderr into the log (final: its last lines too, before a restart or the end).
  void drain_stderr(Process& p, bool final = false);
  void fail(const std::string& episode, const std::string& why);
  std::string describe(const Process& p) const;

  EnvConfig cfg_;
  int64_t vocab_size_;
  EnvInfo info_;
  std::vector<Process> procs_;
  std::map<std::string, int> owner_;    // open episode -> process index
  // Open episodes whose state died while their model took its turn (their process
  // restarted, or slimpi's restore of them failed) -> why: their next step fails.
  std::map<std::string, std::string> lost_;
  std::map<std::string, Recovery> recovery_;  // open episodes, when info_.snapshots
  std::vector<EnvReply> ready_;
  int64_t restarts_ = 0;
};

}  // namespace slimpi
