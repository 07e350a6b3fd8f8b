// Child processes for the benchmark's local ranks: spawn with output to a
// log file, wait with a deadline, kill what is left. Nothing outlives the
// parent's wait_all: every child is reaped; and a rank dies with the parent
// killed by SIGKILL (the worker sets PR_SET_PDEATHSIG, rank_worker.cc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace compcoll::bench {

struct Child {
  pid_t pid = -1;
  int rank = -1;
  std::string log;   // stdout+stderr of the child
  bool done = false;
  int status = 0;    // waitpid status once done
  // Killed by wait_all (the run's deadline passed, or it outlived a failed
  // peer by the grace): its signal is then the bench's, not a crash.
  std::string killed_because;
};

// Starts argv[0] with argv (PATH not searched), output appended to log.
Child spawn(const std::vector<std::string>& argv, int rank, const std::string& log);

// Waits for every child until deadline. When one fails (non-zero exit or a
// signal), the others get `grace` to fail on their own (they should: a dead
// peer is an error within the timeout), then SIGKILL. Returns true when all
// exited with status 0. on_poll, when set, runs between polls (every ~20 ms:
// the benchmark's progress line).
bool wait_all(std::vector<Child>& children, std::chrono::steady_clock::time_point deadline,
              std::chrono::milliseconds grace, const std::function<void()>& on_poll = {});

// Ctrl-C (SIGINT), SIGTERM and SIGHUP kill every child registered with
// watch_child() (SIGKILL), reap them (at most ~2 s), remove every live
// RunDir, then the process dies of the signal as usual.
// Install before any handler that should run first and chain to this one
// (ShapedNetwork's teardown chains to the handler it finds).
void kill_children_on_signals();
void watch_child(pid_t pid);

// Kills (SIGKILL) and reaps, when it goes out of scope, every child that
// wait_all() has not seen exit: an exception between spawn() and wait_all()
// leaves nothing running (and nothing writing into a RunDir).
class ReapOnExit {
 public:
  explicit ReapOnExit(std::vector<Child>& children) : children_(children) {}
  ~ReapOnExit();
  ReapOnExit(const ReapOnExit&) = delete;
  ReapOnExit& operator=(const ReapOnExit&) = delete;

 private:
  std::vector<Child>& children_;
};

// A run's scratch directory (rendezvous files, rank logs, results): a fresh
// $TMPDIR/compcoll-bench-XXXXXX (TMPDIR unset: /tmp). Removed with its
// contents on every way out: the destructor (every return and exception),
// and — with kill_children_on_signals() installed — the signal handler,
// after the ranks are dead. Only SIGKILL of this process leaves it behind.
class RunDir {
 public:
  RunDir();  // throws kInternal when the directory cannot be created
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int slot_ = -1;  // in the signal handler's registry
};

// "exit 1", "killed by signal 9", ...
std::string describe_status(int status);
// The same for a child, naming the bench as the killer where wait_all was.
std::string describe_status(const Child& c);

// The last max_bytes of a file, for error reports.
std::string tail_of(const std::string& path, size_t max_bytes = 4000);

// A whole file ("" when it cannot be read).
std::string read_file(const std::string& path);

// This executable's path, to start ranks of the same build.
std::string self_exe();

}  // namespace compcoll::bench
