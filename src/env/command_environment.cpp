#include "env/command_environment.h"

#include <poll.h>
#include <signal.h>
#include <slimpi/error.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "core/child_process.h"
#include "core/log.h"
#include "core/stderr_log.h"
#include "env/env_protocol.h"
#include "core/printable.h"

namespace slimpi {
namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

CommandEnvironment::CommandEnvironment(const EnvConfig& cfg, int64_t vocab_size) : cfg_(cfg), vocab_size_(vocab_size) {
  SLIMPI_CHECK(!cfg_.command.empty(), "rollout.environment = \"command\" needs rollout.env_command");
  signal(SIGPIPE, SIG_IGN);  // a process that exits must not kill the rank
  procs_.resize(size_t(cfg_.processes));
  for (size_t i = 0; i < procs_.size(); ++i) {
    procs_[i].index = int(i);
    start(procs_[i]);
  }
}

CommandEnvironment::~CommandEnvironment() {
  for (Process& p : procs_) drain_stderr(p, /*final=*/true);  // what it wrote before the end
}

std::string CommandEnvironment::describe(const Process& p) const {
  return fmt::format("environment process {} (pid {}, rollout.env_command '{}')", p.index, p.child ? p.child->pid() : -1,
                     cfg_.command);
}

void CommandEnvironment::start(Process& p) {
  p.child = std::make_unique<ChildProcess>(command_under_limits(cfg_.command, cfg_.cpu_limit_s, cfg_.memory_limit_mb), /*capture_stderr=*/true);
  p.in_buf.clear();
  if (!p.err)
    p.err = std::make_unique<StderrLog>(fmt::format("environment process {}", p.index), cfg_.max_stderr_bytes,
                                        "rollout.env_max_stderr_bytes");
  p.err->reset();
  p.out_buf = encode_hello() + "\n";
  const auto deadline = Clock::now() + seconds(cfg_.timeout_s);
  std::string why;
  while (why.empty()) {
    flush(p);
    const size_t nl = p.in_buf.find('\n');
    if (nl != std::string::npos) {
      EnvInfo info;
      why = decode_hello(p.in_buf.substr(0, nl), &info);
      if (why.empty()) {
        p.in_buf.erase(0, nl + 1);
        p.max_episodes = info.max_concurrent_episodes;
        if (p.index == 0 && info_.protocol_version == 0) info_ = info;  // (the rollout side logs it)
        p.last_output = Clock::now();
        return;
      }
      why = fmt::format("its hello \"{}\" is not one: {}", printable_excerpt(p.in_buf.substr(0, nl), 200), why);
      break;
    }
    if (p.in_buf.size() > size_t(cfg_.max_reply_bytes)) {
      why = fmt::format("its hello is longer than rollout.env_max_reply_bytes = {}", cfg_.max_reply_bytes);
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      why = fmt::format("no hello within rollout.env_timeout_s = {} s", cfg_.timeout_s);
      break;
    }
    pollfd fds[2] = {{p.child->stdout_fd(), POLLIN, 0}, {p.child->stderr_fd(), POLLIN, 0}};  // (-1: ignored)
    if (p.child->stdout_fd() < 0) {
      int status = 0;
      p.child->wait_until(Clock::now() + seconds(1), &status);
      why = fmt::format("it exited before its hello ({})", ChildProcess::describe_status(status));
      break;
    }
    ::poll(fds, 2, int(std::min<int64_t>(left, 100)));
    read_lines(p);  // only reads here: in_buf holds the hello
    drain_stderr(p);
  }
  drain_stderr(p, /*final=*/true);  // what it said before it failed
  SLIMPI_FAIL("{} did not start: {}. The environment protocol (docs/environments.md) starts with slimpi writing "
              "{{\"type\": \"hello\", \"protocol_version\": {}}} and the process answering {{\"type\": \"hello\", "
              "\"protocol_version\": {}}} (name, tools, max_concurrent_episodes, deterministic and snapshots optional)",
              describe(p), why, kEnvProtocolVersion, kEnvProtocolVersion);
}

void CommandEnvironment::restart(Process& p, const std::string& why, bool suspects) {
  drain_stderr(p, /*final=*/true);  // its last words (a traceback) before the verdict
  ++p.restarts;
  ++restarts_;
  if (p.restarts <= cfg_.max_restarts)  // (past the bound, the error below says it: no restart is announced)
    log::warn("{} {}; it is killed and restarted (restart {} of at most {}, rollout.env_max_restarts)", describe(p),
              why, p.restarts, cfg_.max_restarts);
  std::vector<std::string> back;
  for (const std::string& episode : p.episodes) {
    const bool outstanding = p.waiting.count(episode) > 0;  // (a request of the runner's, or slimpi's restore)
    if (can_bring_back(episode, outstanding, suspects && outstanding))
      back.push_back(episode);
    else if (outstanding && runner_waits(episode))
      fail(episode, fmt::format("{} {}", describe(p), why));
    else
      lost_[episode] = fmt::format("its environment process was restarted while the model took its turn ({} {}): the "
                                   "episode's state died with it", describe(p), why);
  }
  for (const std::string& episode : p.episodes) owner_.erase(episode);
  p.waiting.clear();
  p.episodes.clear();
  const std::string who = describe(p);
  p.child.reset();  // kills its process group
  SLIMPI_CHECK(p.restarts <= cfg_.max_restarts, "{} failed {} time(s) (rollout.env_max_restarts = {}); the last: {}",
               who, p.restarts, cfg_.max_restarts, why);
  start(p);
  for (const std::string& episode : back) bring_back(episode);
  if (!back.empty())
    log::warn("{} episode(s) of the restarted process brought back: restored from their snapshots (or, before their "
              "first observation, reset again), their requests in flight sent again", back.size());
}

bool CommandEnvironment::runner_waits(const std::string& episode) const {
  auto it = recovery_.find(episode);
  if (it == recovery_.end()) return true;
  const Recovery& r = it->second;
  return !r.own_restore || !r.in_flight.empty() || r.runner_awaits_restored;
}

void CommandEnvironment::episode_failed(const std::string& episode, const std::string& why) {
  const bool waits = runner_waits(episode);
  if (auto it = recovery_.find(episode); it != recovery_.end()) it->second.own_restore = false;  // nothing outstanding now
  if (waits)
    fail(episode, why);
  else
    lost_[episode] = why;
}

bool CommandEnvironment::can_bring_back(const std::string& episode, bool waiting, bool suspect) {
  auto it = recovery_.find(episode);
  if (it == recovery_.end() || suspect) return false;
  Recovery& r = it->second;
  if (waiting && ++r.deaths_waiting > 1) return false;  // waiting at two deaths: perhaps their cause
  // A snapshot to restore (the runner's restore has one), or its reset in flight (no observation yet).
  return !r.snapshot.empty() || (r.steps == 0 && !r.in_flight.empty());
}

void CommandEnvironment::bring_back(const std::string& episode) {
  Recovery& r = recovery_.at(episode);
  if (r.snapshot.empty()) {  // the reset in flight, sent again: nothing of it was observed
    open(episode, r.in_flight);
    return;
  }
  r.own_restore = true;  // its restored reply then sends the request in flight, if any
  open(episode, encode_restore(r.start, r.snapshot_turns, r.snapshot));
}

bool CommandEnvironment::track_reply(Process& p, const EnvReply& reply) {
  auto it = recovery_.find(reply.episode);
  if (it == recovery_.end()) return true;
  Recovery& r = it->second;
  if (r.own_restore) {  // the answer to slimpi's restore
    const bool runner_waits_too = r.runner_awaits_restored;
    r.own_restore = r.runner_awaits_restored = false;
    if (reply.restored) {
      if (!r.in_flight.empty()) send(p, reply.episode, r.in_flight, true);
      return runner_waits_too;  // the runner's own restore was answered too
    }
    const std::string why = fmt::format("{} answered the restore that was to bring the episode back after its "
                                        "process died with {}", describe(p),
                                        reply.error != EnvError::None ? "an error: " + reply.message
                                                                      : std::string("an observation"));
    const bool runner_waiting = !r.in_flight.empty() || runner_waits_too;
    r.in_flight.clear();
    if (runner_waiting)
      fail(reply.episode, why);
    else
      lost_[reply.episode] = why;
    return false;
  }
  if (reply.restored) {  // the runner's restore answered, or a restored reply it did not ask for (it fails it)
    r.runner_awaits_restored = false;
    return true;
  }
  r.in_flight.clear();
  if (!reply.snapshot.empty()) {
    r.snapshot = reply.snapshot;
    r.snapshot_turns = r.steps;
  }
  return true;
}

void CommandEnvironment::fail(const std::string& episode, const std::string& why) {
  EnvReply r;
  r.episode = episode;
  r.failed = true;
  r.error = EnvError::Infra;
  r.message = why;
  ready_.push_back(std::move(r));
}

void CommandEnvironment::send(Process& p, const std::string& episode, const std::string& line, bool expects_reply) {
  p.out_buf += line;
  p.out_buf += '\n';
  if (expects_reply) p.waiting[episode] = Clock::now() + seconds(cfg_.timeout_s);
  flush(p);
}

void CommandEnvironment::flush(Process& p) {
  while (!p.out_buf.empty() && p.child && p.child->stdin_fd() >= 0) {
    const ssize_t w = write(p.child->stdin_fd(), p.out_buf.data(), p.out_buf.size());
    if (w > 0) {
      p.out_buf.erase(0, size_t(w));
    } else {
      if (w < 0 && errno == EAGAIN) return;
      if (w < 0 && errno == EINTR) continue;
      p.child->close_stdin();  // it closed its stdin: it is exiting, which the reads will see
      p.out_buf.clear();
    }
  }
}

void CommandEnvironment::read_lines(Process& p) {
  char buf[65536];
  while (p.child && p.child->stdout_fd() >= 0) {
    const ssize_t r = read(p.child->stdout_fd(), buf, sizeof(buf));
    if (r > 0) {
      p.in_buf.append(buf, size_t(r));
      p.last_output = Clock::now();
      if (p.in_buf.size() > size_t(cfg_.max_reply_bytes)) return;  // the caller checks the line length
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return;
    p.child->close_stdout();  // EOF: it exited
  }
}

void CommandEnvironment::drain_stderr(Process& p, bool final) {
  if (p.child) p.err->drain(*p.child, final);
}

void CommandEnvironment::reset(const EpisodeStart& start) {
  const std::string line = encode_reset(start);
  if (info_.snapshots) recovery_[start.episode] = Recovery{start, "", 0, 0, line};
  open(start.episode, line);
}

void CommandEnvironment::restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot) {
  SLIMPI_CHECK(info_.snapshots, "environment: restore of episode {}, but {} takes no snapshots", start.episode,
               info_.name);
  Recovery r{start, snapshot, turns, turns, ""};
  r.runner_awaits_restored = true;
  recovery_[start.episode] = std::move(r);
  open(start.episode, encode_restore(start, turns, snapshot));
}

void CommandEnvironment::open(const std::string& episode, const std::string& line) {
  SLIMPI_CHECK(!owner_.count(episode), "environment: episode {} is already open", episode);
  Process* best = &procs_.front();
  auto room = [](const Process& p) { return p.max_episodes - int64_t(p.episodes.size()); };
  for (Process& p : procs_)
    if (room(p) > room(*best)) best = &p;
  SLIMPI_CHECK(room(*best) > 0, "environment: episode {} opened with every process full (the caller keeps to "
               "capacity())", episode);
  best->episodes.insert(episode);
  owner_[episode] = best->index;
  send(*best, episode, line, true);
}

int64_t CommandEnvironment::capacity() const {
  int64_t n = 0;  // each at most kMaxConcurrentEpisodes, at most 4096 processes: no overflow
  for (const Process& p : procs_) n += p.max_episodes;
  return n;
}

void CommandEnvironment::step(const EpisodeAction& action) {
  if (auto lost = lost_.find(action.episode); lost != lost_.end()) {
    fail(action.episode, lost->second);
    lost_.erase(lost);
    return;
  }
  auto it = owner_.find(action.episode);
  SLIMPI_CHECK(it != owner_.end(), "environment: step for episode {}, which is not open", action.episode);
  const std::string line = encode_step(action);
  if (auto rec = recovery_.find(action.episode); rec != recovery_.end()) {
    rec->second.in_flight = line;
    ++rec->second.steps;
    if (rec->second.own_restore) return;  // sent when the episode is back (its restored reply)
  }
  send(procs_[size_t(it->second)], action.episode, line, true);
}

void CommandEnvironment::close(const std::string& episode) {
  lost_.erase(episode);
  recovery_.erase(episode);
  auto it = owner_.find(episode);
  if (it == owner_.end()) return;
  Process& p = procs_[size_t(it->second)];
  p.episodes.erase(episode);
  p.waiting.erase(episode);
  owner_.erase(it);
  send(p, episode, encode_close(episode), false);
}

std::vector<EnvReply> CommandEnvironment::poll(double wait_s) {
  if (ready_.empty() && wait_s > 0) {
    std::vector<pollfd> fds;
    for (Process& p : procs_)
      for (const int fd : {p.child ? p.child->stdout_fd() : -1, p.child ? p.child->stderr_fd() : -1})
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});  // stderr too: a process blocked on it is drained
    ::poll(fds.data(), fds.size(), int(wait_s * 1000));
  }
  for (Process& p : procs_) {
    flush(p);
    read_lines(p);
    drain_stderr(p);
    std::string restart_why;
    bool suspects = false;
    for (size_t nl; restart_why.empty() && (nl = p.in_buf.find('\n')) != std::string::npos;) {
      const std::string line = p.in_buf.substr(0, nl);
      p.in_buf.erase(0, nl + 1);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (line.size() > size_t(cfg_.max_reply_bytes)) {
        restart_why = fmt::format("wrote a line of {} bytes (rollout.env_max_reply_bytes = {})", line.size(),
                                  cfg_.max_reply_bytes);
        break;
      }
      EnvReply reply;
      std::string why;
      const ReplyParse parsed = decode_reply(line, vocab_size_, &reply, &why);
      if (parsed == ReplyParse::Garbage) {
        restart_why = fmt::format("wrote \"{}\", which is not a reply naming an episode ({})",
                                  printable_excerpt(line, 120), why);
        break;
      }
      if (!p.waiting.erase(reply.episode)) {  // no request outstanding: late, repeated or for no episode
        if (++p.unsolicited == 1)
          log::warn("{} answered episode {} with no request of it outstanding (late after a time-out, a second "
                    "reply, or an unknown episode): dropped. Said once per process",
                    describe(p), printable_excerpt(reply.episode, 40));
        continue;
      }
      if (parsed == ReplyParse::BadReply) {
        episode_failed(reply.episode, fmt::format("{} answered \"{}\": {}", describe(p), printable_excerpt(line, 120), why));
        continue;
      }
      if (track_reply(p, reply)) ready_.push_back(std::move(reply));
    }
    if (restart_why.empty() && p.in_buf.size() > size_t(cfg_.max_reply_bytes))
      restart_why = fmt::format("wrote more than rollout.env_max_reply_bytes = {} bytes without a newline",
                                cfg_.max_reply_bytes);
    if (restart_why.empty() && p.child->stdout_fd() < 0) {  // EOF on its stdout: noticed at once
      int status = 0;
      restart_why = p.child->wait_until(Clock::now() + seconds(1), &status)
                        ? fmt::format("exited ({})", ChildProcess::describe_status(status))
                        : std::string("closed its stdout (it is still running, but can no longer reply)");
    }
    const auto now = Clock::now();
    if (restart_why.empty()) {
      std::vector<std::string> late;
      for (const auto& [episode, deadline] : p.waiting)
        if (now > deadline) late.push_back(episode);
      if (!late.empty() && now - p.last_output > seconds(cfg_.timeout_s)) {
        restart_why = fmt::format("has written nothing for rollout.env_timeout_s = {} s with {} episodes waiting",
                                  cfg_.timeout_s, p.waiting.size());
        suspects = true;  // a hang: the waiting episodes may have caused it
      } else {
        for (const std::string& episode : late) {
          p.waiting.erase(episode);
          episode_failed(episode, fmt::format("{} gave no reply within rollout.env_timeout_s = {} s", describe(p),
                                              cfg_.timeout_s));
        }
      }
    }
    if (!restart_why.empty()) restart(p, restart_why, suspects);
  }
  std::vector<EnvReply> out;
  out.swap(ready_);
  return out;
}

void CommandEnvironment::exclude_pause(double s) {
  const auto d = seconds(s);
  for (Process& p : procs_) {
    for (auto& [episode, deadline] : p.waiting) deadline += d;
    p.last_output += d;
  }
}

}  // namespace slimpi
