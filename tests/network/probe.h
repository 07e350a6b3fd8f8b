// Test helpers for tests/network: run code inside a network namespace
// (fork + setns), plain-socket echo and throughput probes, commands with
// captured output. Every wait is bounded.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace compcoll::nettest {

// Runs argv (no shell), returns exit status (-1 when it could not run or timed
// out) and stdout+stderr in *output.
int run_capture(const std::vector<std::string>& argv, std::string* output,
                int timeout_ms = 10000);

// Forks a child that enters namespace `netns` (setns on /run/netns/NAME),
// runs body and _exits with its return value (an alarm kills it after
// alarm_s). Returns the child's pid.
pid_t fork_in_netns(const std::string& netns, const std::function<int()>& body,
                    unsigned alarm_s = 30);

// waitpid with a deadline; SIGKILLs the child when it passes. Returns the
// status, or -1 when the child had to be killed.
int wait_for(pid_t pid, int timeout_ms);

// True when exited with code 0.
bool exited_ok(int status);

// TCP: connects to address:port (retrying refused connections for up to
// timeout_ms), sends `message`, expects it echoed back. Returns 0 on success,
// a distinct non-zero code per failure.
int echo_client(const std::string& address, int port, const std::string& message,
                int timeout_ms = 5000);

// TCP echo server: listens on address:port, writes one byte to ready_fd (when
// >= 0) once listening, echoes `connections` connections one after another.
int echo_server(const std::string& address, int port, int connections, int ready_fd);

struct Throughput {
  bool ok = false;
  double mbit_per_s = 0;
  double seconds = 0;
  unsigned long long bytes = 0;
  std::string error;
};

// Sends for `seconds` over TCP from namespace from_ns to to_address:port,
// with the receiver in to_ns; the rate is what the receiver saw between its
// first and its last byte.
Throughput measure_tcp(const std::string& from_ns, const std::string& to_ns,
                       const std::string& to_address, int port, double seconds);

}  // namespace compcoll::nettest
