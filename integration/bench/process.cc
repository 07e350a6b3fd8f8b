#include "integration/bench/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "compcoll/error.h"

extern char** environ;

namespace compcoll::bench {

Child spawn(const std::vector<std::string>& argv, int rank, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child c;
  c.rank = rank;
  c.log = log;
  const int rc = posix_spawn(&c.pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  CC_CHECK(rc == 0, kInternal, "cannot start rank ", rank, " (", argv[0], "): ", std::strerror(rc));
  return c;
}

namespace {

// Async-signal-safe registry: fixed array, atomic count.
constexpr int kMaxWatched = 1024;
pid_t g_watched[kMaxWatched];
std::atomic<int> g_watched_count{0};

void on_signal(int sig) {
  const int n = g_watched_count.load();
  for (int i = 0; i < n; ++i) kill(g_watched[i], SIGKILL);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void kill_children_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

void watch_child(pid_t pid) {
  const int i = g_watched_count.load();
  if (i < kMaxWatched) {
    g_watched[i] = pid;
    g_watched_count.store(i + 1);
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool wait_all(std::vector<Child>& children, std::chrono::steady_clock::time_point deadline,
              std::chrono::milliseconds grace) {
  using Clock = std::chrono::steady_clock;
  bool ok = true;
  auto kill_at = deadline;
  for (;;) {
    size_t running = 0;
    for (Child& c : children) {
      if (c.done) continue;
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) {
        c.done = true;
        c.status = status;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          if (ok) kill_at = std::min(deadline, Clock::now() + grace);
          ok = false;
        }
      } else {
        ++running;
      }
    }
    if (running == 0) return ok;
    if (Clock::now() >= kill_at) {
      for (Child& c : children) {
        if (!c.done) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &c.status, 0);
          c.done = true;
        }
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string tail_of(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() <= max_bytes ? s : s.substr(s.size() - max_bytes);
}

}  // namespace compcoll::bench
