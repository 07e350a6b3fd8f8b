// Shaped multi-"host" networks on one machine for `compcoll-bench allreduce
// --link RATE`: one network namespace per local rank, joined by a Linux
// bridge, every rank's link shaped with `tc qdisc ... tbf` at RATE in both
// directions. See docs/networks.md.
//
// Topology of one ShapedNetwork (the pid and a per-process sequence number
// make the names unique per run):
//
//   namespace compcoll-<pid>-<seq>-sw      (the "switch"; nothing else in it)
//     br0 (bridge)  <- r0, r1, ... (veth, tbf egress towards the rank)
//   namespace compcoll-<pid>-<seq>-r<k>    (one per rank k)
//     lo (up), eth0 = 198.18.0.<k+1>/24 (veth peer of r<k>, tbf egress)
//
// Nothing is created in the caller's namespace: the bridge and the switch
// side of every veth live in the switch namespace, so the host's interfaces,
// routes and netfilter rules are untouched and deleting the namespaces
// removes everything.
//
// Teardown happens in the destructor, on failure inside the constructor, on
// SIGINT/SIGTERM/SIGHUP once install_teardown_on_signals() was called, and —
// when the owning process dies any other way (SIGKILL, a crash) — in a small
// watchdog process that the constructor forks. teardown_stale() removes what
// is left of runs whose owner died while the watchdog could not run either.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace compcoll::bench {

// A link rate in bits per second. bits_per_second == 0 means "unshaped"
// (no qdisc); parse_link_rate never returns that.
struct LinkRate {
  uint64_t bits_per_second = 0;
  std::string text;  // canonical form, e.g. "1gbit", "2500mbit"
};

// Accepts <number><unit> with unit one of bit, kbit, mbit, gbit, tbit (SI:
// 1kbit = 1000 bit/s, as tc counts), case-insensitive, number an integer or a
// decimal ("1.5gbit"); the rate must lie in [1mbit, 1tbit]. Anything else
// throws compcoll::Error(kInvalidArgument) naming the value and these forms.
LinkRate parse_link_rate(const std::string& s);

// tbf parameters chosen for a rate (documented in docs/networks.md):
//   burst = max(rate/250 s, 128 KiB)   (one 4 ms tick at HZ=250, and at least
//                                       two 64 KiB GSO packets)
//   limit = burst + rate * 10 ms       (queue; TCP reaches ~95% of the rate)
struct TbfParams {
  uint64_t rate_bits = 0;
  uint64_t burst_bytes = 0;
  uint64_t limit_bytes = 0;
};
TbfParams tbf_params(const LinkRate& rate);

struct NetworkOptions {
  // Fork a watchdog process that tears the network down if this process dies
  // without running the destructor (SIGKILL, crash). Leave on outside tests.
  bool watchdog = true;
  // Testing only: when >= 0, the construction throws kInternal after that
  // many setup commands succeeded (exercises the cleanup on failure).
  int fail_after_commands = -1;
};

class ShapedNetwork {
 public:
  static constexpr int kMaxRanks = 250;

  // Builds everything or throws (after removing what it built). Throws
  // kUnsupported when not root or when `ip netns` is not permitted / iproute2
  // is missing, kInvalidArgument for a bad rank count, kInternal when a
  // setup command fails (the message quotes the command and its stderr).
  // Calls teardown_stale() first.
  ShapedNetwork(int ranks, const LinkRate& rate, NetworkOptions options = {});
  ~ShapedNetwork();  // tears down, never throws
  ShapedNetwork(const ShapedNetwork&) = delete;
  ShapedNetwork& operator=(const ShapedNetwork&) = delete;

  int ranks() const { return ranks_; }
  const LinkRate& rate() const { return rate_; }
  const std::string& netns(int rank) const;        // rank's namespace name
  const std::string& switch_netns() const { return switch_ns_; }
  std::string address(int rank) const;             // "198.18.0.<rank+1>"
  static constexpr int kPrefixLength = 24;         // of address()
  // argv prefix running a command inside rank's namespace:
  // {"/usr/sbin/ip", "netns", "exec", netns(rank)}.
  std::vector<std::string> exec_prefix(int rank) const;
  // Every namespace this network created (switch first).
  std::vector<std::string> namespaces() const;

  // Idempotent explicit teardown (what the destructor does): SIGKILLs any
  // process still inside the namespaces, deletes the namespaces, disarms the
  // watchdog. Never throws; problems are reported on stderr.
  void teardown() noexcept;

  // Removes namespaces named compcoll-<pid>-... whose <pid> is no longer a
  // live process (leftovers of crashed runs), killing processes still in them.
  // Never throws.
  static void teardown_stale() noexcept;

  // Installs handlers for SIGINT, SIGTERM and SIGHUP that delete the
  // namespaces of every live ShapedNetwork synchronously (async-signal-safe:
  // only pipe/_Fork/execve/write/waitpid on buffers prepared at construction),
  // then chain to the previous handler, or — when that was SIG_DFL — restore
  // the default and re-raise so the process still dies of the signal. A
  // signal that was ignored (SIG_IGN) is left ignored. Idempotent. Works
  // while the process is blocked anywhere; only the process that built a
  // network tears it down (not a forked copy of it).
  static void install_teardown_on_signals();

  // The name prefix of everything created ("compcoll-").
  static const char* name_prefix();

 private:
  void build(const NetworkOptions& options);
  void start_watchdog();
  void stop_watchdog() noexcept;

  int ranks_ = 0;
  LinkRate rate_;
  pid_t owner_ = -1;  // the constructing process
  std::string ip_;  // path of the ip binary
  std::string tc_;  // path of the tc binary
  std::string switch_ns_;
  std::vector<std::string> rank_ns_;
  int slot_ = -1;          // index in the signal-teardown registry
  pid_t watchdog_ = -1;
  int watchdog_fd_ = -1;   // write end; EOF without 'x' makes it tear down
  bool torn_down_ = false;
};

}  // namespace compcoll::bench
