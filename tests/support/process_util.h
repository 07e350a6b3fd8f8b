// Child processes for the multi-process transport tests: compcoll_transport_peer
// ranks and a throw-away redis-server, all on 127.0.0.1. Every wait is
// bounded, and ChildSet kills and reaps whatever is still running when it
// goes out of scope, so a failing test never leaves processes behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace compcoll::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// posix_spawn's argv[0] (searched in PATH) with stdout+stderr to out_path
// (or /dev/null when empty). Throws std::runtime_error on failure.
pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path);

// Waits for pid to exit until `limit` passes. Returns the raw wait status, or
// nothing if it is still running.
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds limit);

// Tracks children; the destructor SIGKILLs and reaps every one still alive.
class ChildSet {
 public:
  ~ChildSet();
  pid_t add(pid_t pid);
  // Reaps pid (bounded); returns its status or nothing on timeout.
  std::optional<int> wait(pid_t pid, std::chrono::milliseconds limit);
  void kill_all();
  const std::vector<pid_t>& alive() const { return alive_; }

 private:
  std::vector<pid_t> alive_;
};

// Whole file, "" when absent.
std::string read_file(const std::string& path);

// A command run to its end: its exit code (exit_code(); -1 when it was still
// running at the limit, and then killed) and its stdout+stderr.
struct RunResult {
  int code = -1;
  std::string output;
};
// Runs argv (as spawn) with its output in a temporary file, waits up to
// `limit`, and kills it past that. The caller's test fails with `what`
// named when the limit is reached.
RunResult run_to_exit(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                      const std::string& what);

// Polls until `path` contains `needle` or `limit` passes.
bool wait_for_text(const std::string& path, const std::string& needle,
                   std::chrono::milliseconds limit);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_loopback_port();

// Whether something accepts TCP connections on 127.0.0.1:port.
bool port_accepts(int port);

// Full path of an executable found in PATH, "" when absent.
std::string find_in_path(const std::string& name);

// Exit code of a wait status, or -signal when it was killed by a signal.
int exit_code(int status);

}  // namespace compcoll::testing
