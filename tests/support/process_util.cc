#include "tests/support/process_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <gtest/gtest.h>

extern char** environ;

namespace compcoll::testing {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/compcoll-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path) {
  if (argv.empty()) throw std::runtime_error("spawn: empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string out = out_path.empty() ? "/dev/null" : out_path;
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw std::runtime_error("posix_spawnp " + argv[0] + ": " + std::strerror(rc));
  }
  return pid;
}

std::optional<int> wait_exit(pid_t pid, milliseconds limit) {
  const auto deadline = steady_clock::now() + limit;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;  // not our child / already reaped
    if (steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

ChildSet::~ChildSet() { kill_all(); }

pid_t ChildSet::add(pid_t pid) {
  alive_.push_back(pid);
  return pid;
}

std::optional<int> ChildSet::wait(pid_t pid, milliseconds limit) {
  std::optional<int> status = wait_exit(pid, limit);
  if (status) alive_.erase(std::remove(alive_.begin(), alive_.end(), pid), alive_.end());
  return status;
}

void ChildSet::kill_all() {
  for (pid_t pid : alive_) kill(pid, SIGKILL);
  for (pid_t pid : alive_) wait_exit(pid, milliseconds(5000));
  alive_.clear();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult run_to_exit(const std::vector<std::string>& argv, milliseconds limit,
                      const std::string& what) {
  TempDir dir;
  const std::string out = dir.path() + "/output";
  ChildSet children;  // kills the child if the limit passes
  const pid_t pid = children.add(spawn(argv, out));
  const auto status = children.wait(pid, limit);
  EXPECT_TRUE(status.has_value()) << what << " did not finish in " << limit.count() / 1000
                                  << " s";
  return {status ? exit_code(*status) : -1, read_file(out)};
}

bool wait_for_text(const std::string& path, const std::string& needle,
                   milliseconds limit) {
  const auto deadline = steady_clock::now() + limit;
  while (read_file(path).find(needle) == std::string::npos) {
    if (steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    throw std::runtime_error("bind 127.0.0.1:0: " + err);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool port_accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  for (const char* d : {"/usr/sbin", "/usr/bin", "/sbin"}) {
    const std::string full = std::string(d) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

}  // namespace compcoll::testing
