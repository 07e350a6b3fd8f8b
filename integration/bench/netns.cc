#include "integration/bench/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "compcoll/error.h"

namespace compcoll::bench {
namespace {

constexpr const char* kPrefix = "compcoll-";
constexpr const char* kNetnsDir = "/run/netns";
constexpr int kCommandTimeoutMs = 20000;

// Fixed environment for ip/tc: stable (English) messages, no dependence on
// the caller's PATH.
char kEnvPath[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
char kEnvLang[] = "LC_ALL=C";
char* kToolEnv[] = {kEnvPath, kEnvLang, nullptr};

// ---------------------------------------------------------------------------
// Running ip / tc (normal context).

struct CommandResult {
  int status = -1;  // waitpid status
  bool timed_out = false;
  std::string out;
  std::string err;
  bool ok() const { return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

std::string quote(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += a;
  }
  return s;
}

std::string describe(const CommandResult& r) {
  if (r.timed_out) return "timed out";
  if (WIFEXITED(r.status)) return "exit " + std::to_string(WEXITSTATUS(r.status));
  if (WIFSIGNALED(r.status)) return "killed by signal " + std::to_string(WTERMSIG(r.status));
  return "status " + std::to_string(r.status);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// posix_spawn argv (no shell, PATH not searched), stdin from /dev/null,
// stdout and stderr captured; killed after timeout_ms.
CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms = kCommandTimeoutMs) {
  CommandResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.err = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.err = std::string("pipe: ") + std::strerror(errno);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  // The child starts with default dispositions and an empty mask, whatever
  // handlers this process installed.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), kToolEnv);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = std::string("cannot start: ") + std::strerror(rc);
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        if (sinks[i]->size() < (1u << 20)) sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = status;
  return result;
}

std::string find_tool(const char* name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    std::string path = std::string(dir) + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

const char* kNeedsRoot =
    "--link needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN: network namespaces, veth, a bridge, "
    "tc tbf) and iproute2 (ip, tc); run as root or without --link";

// ---------------------------------------------------------------------------
// Async-signal-safe teardown: each live network owns a slot whose batch
// ("netns del NAME\n" per namespace) is written before anything is created.
// The signal handler and the watchdog feed it to `ip -force -batch -`.

constexpr int kSlots = 16;
constexpr size_t kBatchCap = 64 * (ShapedNetwork::kMaxRanks + 1);
constexpr size_t kPathCap = 128;

enum SlotState : int { kFree = 0, kFilling = 1, kArmed = 2, kSignalled = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  pid_t owner = -1;  // a forked copy of the owner must not tear down
  char ip[kPathCap];
  char batch[kBatchCap];
  size_t len = 0;
};
Slot g_slots[kSlots];

void sleep_ms_signal_safe(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Runs `ip -force -batch -` with `batch` on stdin, output discarded, and
// waits for it (bounded: 20 s, then SIGKILL). Uses only async-signal-safe
// calls: socketpair, _Fork, dup2, open, sigprocmask, execve, send, close,
// waitpid, kill, nanosleep. A socket rather than a pipe so an early exit of ip
// gives EPIPE, not SIGPIPE (MSG_NOSIGNAL).
void run_batch_signal_safe(const char* ip, const char* batch, size_t len) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  const pid_t pid = _Fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return;
  }
  if (pid == 0) {
    dup2(sv[0], STDIN_FILENO);
    const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) {
      dup2(devnull, STDOUT_FILENO);
      dup2(devnull, STDERR_FILENO);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    char a0[] = "ip", a1[] = "-force", a2[] = "-batch", a3[] = "-";
    char* argv[] = {a0, a1, a2, a3, nullptr};
    execve(ip, argv, kToolEnv);
    _exit(127);
  }
  close(sv[0]);
  size_t off = 0;
  while (off < len) {
    const ssize_t n = send(sv[1], batch + off, len - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(sv[1]);
  for (int i = 0; i < 2000; ++i) {  // 2000 * 10 ms
    int status;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return;
    sleep_ms_signal_safe(10);
  }
  kill(pid, SIGKILL);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// Signal handling: previous actions, so we chain to them.
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[3];
std::atomic<bool> g_installed{false};

int signal_index(int sig) {
  for (int i = 0; i < 3; ++i)
    if (kSignals[i] == sig) return i;
  return -1;
}

void on_terminating_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const pid_t self = getpid();
  for (Slot& slot : g_slots) {
    if (slot.owner != self) continue;
    int expected = kArmed;
    if (slot.state.compare_exchange_strong(expected, kSignalled))
      run_batch_signal_safe(slot.ip, slot.batch, slot.len);
  }
  errno = saved_errno;
  const int i = signal_index(sig);
  if (i < 0) return;
  const struct sigaction& prev = g_previous[i];
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler == SIG_IGN) return;
  if (prev.sa_handler == SIG_DFL) {
    // Die of the signal as if we had never caught it: the signal is blocked
    // while we run, so raise() leaves it pending until we return.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  prev.sa_handler(sig);
}

int claim_slot() {
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (g_slots[i].state.compare_exchange_strong(expected, kFilling)) return i;
  }
  return -1;
}

std::atomic<unsigned> g_sequence{0};

// pid from "compcoll-<pid>-...", or -1.
pid_t owner_pid(const std::string& name) {
  const std::string prefix = kPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  long long pid = 0;
  size_t digits = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && digits < 10) {
    pid = pid * 10 + (name[i] - '0');
    ++i;
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '-' || pid <= 1) return -1;
  return static_cast<pid_t>(pid);
}

// SIGKILLs the processes inside namespace `ns` (never this process).
void kill_processes_in(const std::string& ip, const std::string& ns) {
  const CommandResult r = run_command({ip, "netns", "pids", ns}, 5000);
  if (!r.ok()) return;
  std::istringstream in(r.out);
  long long pid;
  while (in >> pid) {
    if (pid > 1 && pid != getpid()) kill(static_cast<pid_t>(pid), SIGKILL);
  }
}

bool netns_exists(const std::string& ns) {
  return access((std::string(kNetnsDir) + "/" + ns).c_str(), F_OK) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------

LinkRate parse_link_rate(const std::string& s) {
  auto bad = [&s]() {
    CC_THROW(kInvalidArgument, "invalid --link rate '", s,
             "': expected <number><unit> with unit bit, kbit, mbit, gbit or tbit "
             "(SI multiples as tc counts them), e.g. 1gbit, 10gbit, 500mbit, 1000000kbit, "
             "1.5gbit; between 1mbit and 1tbit");
  };
  std::string t;
  for (char c : s) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t i = 0;
  uint64_t int_part = 0;
  size_t int_digits = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
    if (int_digits >= 15) bad();
    int_part = int_part * 10 + static_cast<uint64_t>(t[i] - '0');
    ++int_digits;
    ++i;
  }
  if (int_digits == 0) bad();
  uint64_t frac = 0, frac_scale = 1;
  if (i < t.size() && t[i] == '.') {
    ++i;
    size_t frac_digits = 0;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
      if (frac_digits >= 12) bad();
      frac = frac * 10 + static_cast<uint64_t>(t[i] - '0');
      frac_scale *= 10;
      ++frac_digits;
      ++i;
    }
    if (frac_digits == 0) bad();
  }
  const std::string unit = t.substr(i);
  uint64_t mult = 0;
  if (unit == "bit") mult = 1;
  else if (unit == "kbit") mult = 1000ull;
  else if (unit == "mbit") mult = 1000000ull;
  else if (unit == "gbit") mult = 1000000000ull;
  else if (unit == "tbit") mult = 1000000000000ull;
  else bad();
  constexpr uint64_t kMin = 1000000ull, kMax = 1000000000000ull;
  if (int_part > kMax) bad();  // int_part * mult could overflow otherwise
  const unsigned __int128 whole = static_cast<unsigned __int128>(int_part) * mult;
  const unsigned __int128 frac_bits = static_cast<unsigned __int128>(frac) * mult;
  if (frac_bits % frac_scale != 0) bad();  // not a whole number of bit/s
  const unsigned __int128 bits = whole + frac_bits / frac_scale;
  if (bits < kMin || bits > kMax) bad();
  LinkRate rate;
  rate.bits_per_second = static_cast<uint64_t>(bits);
  // Canonical text: the largest unit that divides the rate.
  const std::pair<uint64_t, const char*> units[] = {
      {1000000000000ull, "tbit"}, {1000000000ull, "gbit"}, {1000000ull, "mbit"},
      {1000ull, "kbit"}, {1ull, "bit"}};
  for (const auto& [m, name] : units) {
    if (rate.bits_per_second % m == 0) {
      rate.text = std::to_string(rate.bits_per_second / m) + name;
      break;
    }
  }
  return rate;
}

TbfParams tbf_params(const LinkRate& rate) {
  TbfParams p;
  p.rate_bits = rate.bits_per_second;
  const uint64_t bytes_per_s = rate.bits_per_second / 8;
  p.burst_bytes = std::max<uint64_t>(bytes_per_s / 250, 128 * 1024);
  p.limit_bytes = p.burst_bytes + bytes_per_s / 100;
  return p;
}

const char* ShapedNetwork::name_prefix() { return kPrefix; }

ShapedNetwork::ShapedNetwork(int ranks, const LinkRate& rate, NetworkOptions options)
    : ranks_(ranks), rate_(rate), owner_(getpid()) {
  CC_CHECK(ranks >= 1 && ranks <= kMaxRanks, kInvalidArgument, "--link supports 1 to ", kMaxRanks,
           " local ranks, not ", ranks);
  CC_CHECK(geteuid() == 0, kUnsupported, kNeedsRoot, " (this process runs as uid ", geteuid(),
           ")");
  ip_ = find_tool("ip");
  tc_ = find_tool("tc");
  CC_CHECK(!ip_.empty() && !tc_.empty(), kUnsupported, kNeedsRoot,
           " (ip or tc not found in /usr/sbin, /sbin, /usr/bin, /bin; install iproute2)");
  CC_CHECK(ip_.size() < kPathCap, kUnsupported, "path of ip too long: ", ip_);

  teardown_stale();

  const std::string base = std::string(kPrefix) + std::to_string(getpid()) + "-" +
                           std::to_string(g_sequence.fetch_add(1));
  switch_ns_ = base + "-sw";
  for (int r = 0; r < ranks; ++r) rank_ns_.push_back(base + "-r" + std::to_string(r));

  slot_ = claim_slot();
  CC_CHECK(slot_ >= 0, kUnsupported, "at most ", kSlots,
           " shaped networks can be live in one process");
  Slot& slot = g_slots[slot_];
  slot.owner = owner_;
  std::memcpy(slot.ip, ip_.c_str(), ip_.size() + 1);
  std::string batch;
  for (const auto& ns : namespaces()) batch += "netns del " + ns + "\n";
  if (batch.size() > kBatchCap) {  // cannot happen with kMaxRanks; keep the invariant
    slot.state.store(kFree);
    slot_ = -1;
    CC_THROW(kInternal, "teardown batch too long");
  }
  std::memcpy(slot.batch, batch.data(), batch.size());
  slot.len = batch.size();
  slot.state.store(kArmed);

  try {
    if (options.watchdog) start_watchdog();
    build(options);
  } catch (...) {
    teardown();
    throw;
  }
}

ShapedNetwork::~ShapedNetwork() { teardown(); }

const std::string& ShapedNetwork::netns(int rank) const {
  CC_CHECK(rank >= 0 && rank < ranks_, kInvalidArgument, "rank ", rank, " out of range [0, ",
           ranks_, ")");
  return rank_ns_[static_cast<size_t>(rank)];
}

std::string ShapedNetwork::address(int rank) const {
  CC_CHECK(rank >= 0 && rank < ranks_, kInvalidArgument, "rank ", rank, " out of range [0, ",
           ranks_, ")");
  return "198.18.0." + std::to_string(rank + 1);
}

std::vector<std::string> ShapedNetwork::exec_prefix(int rank) const {
  return {ip_, "netns", "exec", netns(rank)};
}

std::vector<std::string> ShapedNetwork::namespaces() const {
  std::vector<std::string> all{switch_ns_};
  all.insert(all.end(), rank_ns_.begin(), rank_ns_.end());
  return all;
}

void ShapedNetwork::build(const NetworkOptions& options) {
  int done = 0;
  auto step = [&](const std::vector<std::string>& argv, ErrorKind kind_on_failure,
                  const char* hint) {
    if (options.fail_after_commands >= 0 && done >= options.fail_after_commands)
      CC_THROW(kInternal, "injected failure after ", done, " setup commands (testing)");
    const CommandResult r = run_command(argv);
    if (!r.ok()) {
      const std::string msg = "--link setup: `" + quote(argv) + "` failed (" + describe(r) +
                              "): " + trim(r.err.empty() ? r.out : r.err) + hint;
      throw Error(kind_on_failure, "compcoll: " + msg);
    }
    ++done;
  };
  const std::string needs_root = std::string("; ") + kNeedsRoot;
  const char* no_tbf = "; is the tbf qdisc (sch_tbf) available in this kernel?";

  step({ip_, "netns", "add", switch_ns_}, ErrorKind::kUnsupported, needs_root.c_str());
  step({ip_, "-n", switch_ns_, "link", "add", "br0", "type", "bridge"}, ErrorKind::kUnsupported,
       "; is bridge support available in this kernel?");
  step({ip_, "-n", switch_ns_, "link", "set", "br0", "up"}, ErrorKind::kInternal, "");
  const TbfParams tbf = tbf_params(rate_);
  auto tbf_args = [&](const std::string& ns, const std::string& dev) {
    return std::vector<std::string>{tc_, "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", std::to_string(tbf.rate_bits) + "bit",
                                    "burst", std::to_string(tbf.burst_bytes),
                                    "limit", std::to_string(tbf.limit_bytes)};
  };
  for (int r = 0; r < ranks_; ++r) {
    const std::string& ns = rank_ns_[static_cast<size_t>(r)];
    const std::string port = "r" + std::to_string(r);
    step({ip_, "netns", "add", ns}, ErrorKind::kUnsupported, needs_root.c_str());
    step({ip_, "-n", switch_ns_, "link", "add", port, "type", "veth", "peer", "name", "eth0",
          "netns", ns},
         ErrorKind::kUnsupported, "; is veth support available in this kernel?");
    step({ip_, "-n", switch_ns_, "link", "set", port, "master", "br0", "up"},
         ErrorKind::kInternal, "");
    step({ip_, "-n", ns, "link", "set", "lo", "up"}, ErrorKind::kInternal, "");
    step({ip_, "-n", ns, "addr", "add", address(r) + "/" + std::to_string(kPrefixLength), "dev",
          "eth0"},
         ErrorKind::kInternal, "");
    step({ip_, "-n", ns, "link", "set", "eth0", "up"}, ErrorKind::kInternal, "");
    if (rate_.bits_per_second > 0) {
      // Egress towards the rank (bridge side) and from the rank (its eth0).
      step(tbf_args(switch_ns_, port), ErrorKind::kUnsupported, no_tbf);
      step(tbf_args(ns, "eth0"), ErrorKind::kUnsupported, no_tbf);
    }
  }
}

void ShapedNetwork::start_watchdog() {
  int sv[2];
  CC_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, kInternal,
           "socketpair for the --link watchdog: ", std::strerror(errno));
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  const Slot& slot = g_slots[slot_];
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(sv[0]);
    close(sv[1]);
    if (devnull >= 0) close(devnull);
    CC_THROW(kInternal, "fork of the --link watchdog: ", std::strerror(e));
  }
  if (pid == 0) {
    // The watchdog: async-signal-safe calls only (the parent may have threads).
    struct sigaction ign;
    std::memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT, SIGTSTP}) sigaction(s, &ign, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Hold nothing of the parent's: not its stdout (a reader waiting for EOF
    // would hang on us), not its sockets, not its cwd.
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);
      dup2(devnull, STDERR_FILENO);
    }
    dup2(sv[1], 3);
    close_range(4, ~0u, 0);
    if (chdir("/") != 0) {
    }
    char c = 0;
    for (;;) {
      const ssize_t n = read(3, &c, 1);
      if (n == 1 && c == 'x') _exit(0);  // disarmed: the owner tore down
      if (n == 1) continue;
      if (n < 0 && errno == EINTR) continue;
      break;  // EOF or error: the owner died
    }
    run_batch_signal_safe(slot.ip, slot.batch, slot.len);
    _exit(0);
  }
  close(sv[1]);
  if (devnull >= 0) close(devnull);
  watchdog_ = pid;
  watchdog_fd_ = sv[0];
}

void ShapedNetwork::stop_watchdog() noexcept {
  if (watchdog_fd_ >= 0) {
    const char x = 'x';
    (void)send(watchdog_fd_, &x, 1, MSG_NOSIGNAL);
    close(watchdog_fd_);
    watchdog_fd_ = -1;
  }
  if (watchdog_ > 0) {
    bool reaped = false;
    for (int i = 0; i < 300 && !reaped; ++i) {  // 3 s
      int status;
      const pid_t r = waitpid(watchdog_, &status, WNOHANG);
      if (r == watchdog_ || (r < 0 && errno == ECHILD)) reaped = true;
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!reaped) {
      kill(watchdog_, SIGKILL);
      int status;
      while (waitpid(watchdog_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    watchdog_ = -1;
  }
}

void ShapedNetwork::teardown() noexcept {
  // A forked copy of the owner (a child that did not exec) must not tear
  // down its parent's network.
  if (torn_down_ || getpid() != owner_) return;
  torn_down_ = true;
  try {
    const std::vector<std::string> all = namespaces();
    for (const auto& ns : all)
      if (netns_exists(ns)) kill_processes_in(ip_, ns);
    // The switch first: deleting it removes the bridge and every veth pair.
    for (const auto& ns : all) {
      if (!netns_exists(ns)) continue;
      const std::vector<std::string> argv{ip_, "netns", "del", ns};
      const CommandResult r = run_command(argv);
      if (!r.ok() && netns_exists(ns))
        std::fprintf(stderr, "compcoll: --link teardown: `%s` failed (%s): %s\n",
                     quote(argv).c_str(), describe(r).c_str(), trim(r.err).c_str());
    }
  } catch (...) {
    // Out of memory while building argv: fall back to the signal-safe batch.
    if (slot_ >= 0) run_batch_signal_safe(g_slots[slot_].ip, g_slots[slot_].batch,
                                          g_slots[slot_].len);
  }
  stop_watchdog();
  if (slot_ >= 0) {
    g_slots[slot_].state.store(kFree);
    slot_ = -1;
  }
}

void ShapedNetwork::teardown_stale() noexcept {
  try {
    const std::string ip = find_tool("ip");
    if (ip.empty()) return;
    std::vector<std::string> stale;
    if (DIR* dir = opendir(kNetnsDir)) {
      while (dirent* e = readdir(dir)) {
        const std::string name = e->d_name;
        const pid_t owner = owner_pid(name);
        if (owner <= 0 || owner == getpid()) continue;
        if (kill(owner, 0) == 0 || errno != ESRCH) continue;  // owner alive (or not ours to judge)
        stale.push_back(name);
      }
      closedir(dir);
    }
    // Switch namespaces first (removes the links), then the ranks'.
    std::stable_sort(stale.begin(), stale.end(), [](const std::string& a, const std::string& b) {
      const bool sa = a.size() >= 3 && a.compare(a.size() - 3, 3, "-sw") == 0;
      const bool sb = b.size() >= 3 && b.compare(b.size() - 3, 3, "-sw") == 0;
      return sa && !sb;
    });
    for (const auto& ns : stale) kill_processes_in(ip, ns);
    for (const auto& ns : stale) {
      const CommandResult r = run_command({ip, "netns", "del", ns});
      if (!r.ok() && netns_exists(ns))
        std::fprintf(stderr, "compcoll: cannot remove stale namespace %s: %s\n", ns.c_str(),
                     trim(r.err).c_str());
    }
  } catch (...) {
  }
}

void ShapedNetwork::install_teardown_on_signals() {
  bool expected = false;
  if (!g_installed.compare_exchange_strong(expected, true)) return;
  for (int i = 0; i < 3; ++i) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_terminating_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);  // one teardown at a time
    sigaction(kSignals[i], &sa, &g_previous[i]);
    // A signal the process ignores (nohup's SIGHUP) stays ignored: tearing
    // the network down while the run continues would only break it.
    if (!(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_IGN)
      sigaction(kSignals[i], &g_previous[i], nullptr);
  }
}

}  // namespace compcoll::bench
