#include "integration/bench/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

// Async-signal-safe registry: fixed array, atomic count. A reaped child's
// entry becomes -1, so that a signal never kills a recycled pid.
constexpr int kMaxWatched = 2048;
std::atomic<pid_t> g_watched[kMaxWatched];
std::atomic<int> g_watched_count{0};

void unwatch_child(pid_t pid) {
  const int n = g_watched_count.load();
  for (int i = 0; i < n; ++i) {
    if (g_watched[i].load() == pid) g_watched[i].store(-1);
  }
}

// Live RunDirs, for the signal handler: the path is written before the slot
// is armed, and signals are blocked meanwhile.
enum DirState : int { kDirFree = 0, kDirFilling = 1, kDirArmed = 2 };
constexpr int kDirSlots = 8;
struct DirSlot {
  std::atomic<int> state{kDirFree};
  char path[4096];
};
DirSlot g_dirs[kDirSlots];

constexpr int kTerminatingSignals[] = {SIGINT, SIGTERM, SIGHUP};

void sleep_ms_signal_safe(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Waits (at most ~2 s) until every watched child is reaped: SIGKILLed
// processes that are still running could otherwise create files in a run
// directory we are removing. waitpid and nanosleep only.
void reap_watched_signal_safe() {
  const int n = g_watched_count.load();
  for (int tries = 0; tries < 200; ++tries) {
    bool running = false;
    for (int i = 0; i < n; ++i) {
      const pid_t pid = g_watched[i].load();
      if (pid <= 0) continue;
      int status;
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) running = true;
      else g_watched[i].store(-1);  // reaped now, or not our child any more
    }
    if (!running) return;
    sleep_ms_signal_safe(10);
  }
}

bool is_dot_or_dotdot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// rm -rf of name (relative to dirfd) with async-signal-safe calls only:
// unlinkat, openat, lseek, getdents64, close. The tree is a run directory
// (a FileStore, logs): shallow, so depth is bounded, and so are the passes
// (an entry removed while listing can make the listing skip another; the
// next pass finds it).
void remove_tree_signal_safe(int dirfd, const char* name, int depth) {
  if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return;
  if (depth >= 16) return;
  const int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[2048];
  for (int pass = 0; pass < 64; ++pass) {
    if (lseek(fd, 0, SEEK_SET) != 0) break;
    bool any = false;
    for (;;) {
      const ssize_t n = getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
        off += d->d_reclen;
        if (is_dot_or_dotdot(d->d_name)) continue;
        any = true;
        remove_tree_signal_safe(fd, d->d_name, depth + 1);
      }
    }
    if (!any) break;
  }
  close(fd);
  unlinkat(dirfd, name, AT_REMOVEDIR);
}

void on_signal(int sig) {
  const int n = g_watched_count.load();
  for (int i = 0; i < n; ++i) {
    const pid_t pid = g_watched[i].load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  reap_watched_signal_safe();
  for (DirSlot& d : g_dirs) {
    if (d.state.load() == kDirArmed) remove_tree_signal_safe(AT_FDCWD, d.path, 0);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

// Blocks the terminating signals for its lifetime.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : kTerminatingSignals) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

}  // namespace

void kill_children_on_signals() {
  for (int sig : kTerminatingSignals) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

void watch_child(pid_t pid) {
  const int i = g_watched_count.load();
  CC_CHECK(i < kMaxWatched, kInternal, "more than ", kMaxWatched, " child processes to watch");
  g_watched[i].store(pid);
  g_watched_count.store(i + 1);
}

ReapOnExit::~ReapOnExit() {
  for (Child& c : children_) {
    if (c.done || c.pid <= 0) continue;
    kill(c.pid, SIGKILL);
    while (waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
    }
    c.done = true;
    unwatch_child(c.pid);
  }
}

RunDir::RunDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/compcoll-bench-XXXXXX";
  BlockSignals blocked;  // no signal between mkdtemp and arming the slot
  for (int i = 0; i < kDirSlots && slot_ < 0; ++i) {
    int expected = kDirFree;
    if (g_dirs[i].state.compare_exchange_strong(expected, kDirFilling)) slot_ = i;
  }
  CC_CHECK(slot_ >= 0, kInternal, "more than ", kDirSlots, " run directories at once");
  DirSlot& d = g_dirs[slot_];
  if (tmpl.size() >= sizeof d.path || mkdtemp(tmpl.data()) == nullptr) {
    const int err = errno;
    d.state.store(kDirFree);
    CC_THROW(kInternal, "cannot create a temporary directory ", tmpl, ": ",
             tmpl.size() >= sizeof d.path ? "path too long" : std::strerror(err),
             " (set TMPDIR to a writable directory)");
  }
  path_ = tmpl;
  std::memcpy(d.path, path_.c_str(), path_.size() + 1);
  d.state.store(kDirArmed);
}

RunDir::~RunDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) {
    std::fprintf(stderr, "compcoll-bench: cannot remove %s: %s\n", path_.c_str(),
                 ec.message().c_str());
  }
  g_dirs[slot_].state.store(kDirFree);
}

std::string describe_status(const Child& c) {
  if (!c.killed_because.empty()) return "killed by compcoll-bench: " + c.killed_because;
  return describe_status(c.status);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool wait_all(std::vector<Child>& children, std::chrono::steady_clock::time_point deadline,
              std::chrono::milliseconds grace, const std::function<void()>& on_poll) {
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
        unwatch_child(c.pid);
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
      const std::string why =
          ok || Clock::now() >= deadline
              ? "the run's deadline passed"
              : "it was still running " + std::to_string(grace.count()) +
                    " ms after another rank failed";
      for (Child& c : children) {
        if (!c.done) {
          c.killed_because = why;
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &c.status, 0);
          c.done = true;
          unwatch_child(c.pid);
        }
      }
      return false;
    }
    if (on_poll) on_poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail_of(const std::string& path, size_t max_bytes) {
  const std::string s = read_file(path);
  return s.size() <= max_bytes ? s : s.substr(s.size() - max_bytes);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  CC_CHECK(len > 0, kInternal, "cannot find the compcoll-bench executable (/proc/self/exe)");
  buf[len] = '\0';
  return buf;
}

}  // namespace compcoll::bench
