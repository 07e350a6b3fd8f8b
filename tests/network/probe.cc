#include "tests/network/probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

namespace compcoll::nettest {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool make_addr(const std::string& address, int port, sockaddr_in* sa) {
  std::memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, address.c_str(), &sa->sin_addr) == 1;
}

void set_timeouts(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int listen_on(const std::string& address, int port) {
  sockaddr_in sa;
  if (!make_addr(address, port, &sa)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// accept with a timeout.
int accept_within(int listen_fd, int timeout_ms) {
  pollfd p{listen_fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return -1;
  return accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
}

int connect_within(const std::string& address, int port, int timeout_ms) {
  sockaddr_in sa;
  if (!make_addr(address, port, &sa)) return -1;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    set_timeouts(fd, timeout_ms);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
    const int e = errno;
    close(fd);
    if (e != ECONNREFUSED && e != EINTR) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_exact(int fd, void* data, size_t n, int timeout_ms) {
  char* p = static_cast<char*>(data);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    const int pr = poll(&pf, 1, static_cast<int>(left));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

int run_capture(const std::vector<std::string>& argv, std::string* output, int timeout_ms) {
  output->clear();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    *output = std::string("cannot start ") + argv[0] + ": " + std::strerror(rc);
    return -1;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd pf{fds[0], POLLIN, 0};
    const int pr = poll(&pf, 1, static_cast<int>(left));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    const ssize_t r = read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    output->append(buf, static_cast<size_t>(r));
  }
  close(fds[0]);
  const int status = wait_for(pid, static_cast<int>(std::max<long long>(
      100, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
               .count())));
  if (status < 0 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

pid_t fork_in_netns(const std::string& netns, const std::function<int()>& body,
                    unsigned alarm_s) {
  const std::string path = "/run/netns/" + netns;
  const pid_t pid = fork();
  if (pid != 0) return pid;
  alarm(alarm_s);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(90);
  close(fd);
  int rc = 91;
  try {
    rc = body();
  } catch (...) {
  }
  _exit(rc);
}

int wait_for(pid_t pid, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool exited_ok(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int echo_client(const std::string& address, int port, const std::string& message,
                int timeout_ms) {
  const int fd = connect_within(address, port, timeout_ms);
  if (fd < 0) return 10;
  if (!write_all(fd, message.data(), message.size())) {
    close(fd);
    return 11;
  }
  std::string back(message.size(), '\0');
  const bool got = read_exact(fd, back.data(), back.size(), timeout_ms);
  close(fd);
  if (!got) return 12;
  return back == message ? 0 : 13;
}

int echo_server(const std::string& address, int port, int connections, int ready_fd) {
  const int lfd = listen_on(address, port);
  if (lfd < 0) return 20;
  if (ready_fd >= 0) {
    const char c = 'r';
    if (write(ready_fd, &c, 1) != 1) return 21;
  }
  for (int i = 0; i < connections; ++i) {
    const int fd = accept_within(lfd, 10000);
    if (fd < 0) return 22;
    set_timeouts(fd, 10000);
    char buf[4096];
    for (;;) {
      const ssize_t r = read(fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        close(fd);
        return 23;
      }
      if (r == 0) break;
      if (!write_all(fd, buf, static_cast<size_t>(r))) {
        close(fd);
        return 24;
      }
    }
    close(fd);
  }
  close(lfd);
  return 0;
}

Throughput measure_tcp(const std::string& from_ns, const std::string& to_ns,
                       const std::string& to_address, int port, double seconds) {
  Throughput t;
  int ready[2], result[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return t;
  if (pipe2(result, O_CLOEXEC) != 0) {
    close(ready[0]);
    close(ready[1]);
    return t;
  }
  struct Report {
    unsigned long long bytes;
    double seconds;
  };
  const int timeout_ms = static_cast<int>(seconds * 1000) + 10000;
  const pid_t receiver = fork_in_netns(to_ns, [&]() -> int {
    const int lfd = listen_on(to_address, port);
    if (lfd < 0) return 30;
    const char c = 'r';
    if (write(ready[1], &c, 1) != 1) return 31;
    const int fd = accept_within(lfd, 10000);
    if (fd < 0) return 32;
    set_timeouts(fd, 10000);
    std::vector<char> buf(1 << 18);
    Report rep{0, 0};
    Clock::time_point first{}, last{};
    for (;;) {
      const ssize_t r = read(fd, buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return 33;
      if (r == 0) break;
      last = Clock::now();
      if (rep.bytes == 0) first = last;
      rep.bytes += static_cast<unsigned long long>(r);
    }
    rep.seconds = std::chrono::duration<double>(last - first).count();
    return write(result[1], &rep, sizeof rep) == sizeof rep ? 0 : 34;
  });
  close(ready[1]);
  close(result[1]);
  char c;
  if (!read_exact(ready[0], &c, 1, 10000)) {
    t.error = "receiver did not start listening";
    wait_for(receiver, 1000);
    close(ready[0]);
    close(result[0]);
    return t;
  }
  close(ready[0]);
  const pid_t sender = fork_in_netns(from_ns, [&]() -> int {
    const int fd = connect_within(to_address, port, 5000);
    if (fd < 0) return 40;
    std::vector<char> buf(1 << 17, 'x');
    const auto t0 = Clock::now();
    while (seconds_since(t0) < seconds) {
      if (!write_all(fd, buf.data(), buf.size())) return 41;
    }
    close(fd);
    return 0;
  });
  const int sender_status = wait_for(sender, timeout_ms);
  Report rep{0, 0};
  const bool got = read_exact(result[0], &rep, sizeof rep, timeout_ms);
  close(result[0]);
  const int receiver_status = wait_for(receiver, 5000);
  if (!exited_ok(sender_status) || !exited_ok(receiver_status) || !got) {
    t.error = "sender status " + std::to_string(sender_status) + ", receiver status " +
              std::to_string(receiver_status) + (got ? "" : ", no report");
    return t;
  }
  t.ok = rep.seconds > 0;
  t.bytes = rep.bytes;
  t.seconds = rep.seconds;
  t.mbit_per_s = rep.seconds > 0 ? static_cast<double>(rep.bytes) * 8.0 / rep.seconds / 1e6 : 0;
  if (!t.ok) t.error = "no data received";
  return t;
}

}  // namespace compcoll::nettest
