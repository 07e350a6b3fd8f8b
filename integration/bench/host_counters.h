// What a "host" (a network namespace of `compcoll-bench allreduce --link`)
// sent on the wire, from the kernel's interface counters rather than from
// compcoll's own accounting: the figure that shows whether traffic between
// ranks of one host (loopback) stays off the network.
//
// The counter is the interface's tx_bytes (rtnl_link_stats64, the number
// /sys/class/net/IF/statistics/tx_bytes and `ip -s link` show), read through
// /proc/self/net/dev: procfs always shows the calling process's own network
// namespace, whereas /sys/class/net shows the namespace of whoever mounted
// sysfs (right only under `ip netns exec`, which remounts it). It counts
// every byte the interface transmitted: payloads, TCP/IP and Ethernet
// headers, ACKs of what the host received, and the benchmark's own small
// synchronization messages.
#pragma once

#include <cstdint>
#include <string>

namespace compcoll::bench {

// tx_bytes of `iface` in /proc/net/dev-format text; throws kInvalidArgument
// naming the interface when it is not listed.
uint64_t parse_tx_bytes(const std::string& proc_net_dev, const std::string& iface);

// tx_bytes of `iface` in this process's network namespace.
uint64_t interface_tx_bytes(const std::string& iface);

// The identity DESIGN.md gives a host for the hierarchy when no override is
// set: "<boot id>/<inode of /proc/self/ns/net>". Ranks in one namespace of
// one kernel share it; ranks in different namespaces do not.
std::string default_host_identity();

// Meters the bytes one host sends per call. Only the meter of one rank per
// host (the reader) reads the counter; the others report 0, so a MAX over
// ranks is the busiest host. The caller brackets each measured call:
//   comm.barrier(); meter.begin();   // the previous phase is off the wire
//   ... the timed call ...
//   comm.barrier(); total += meter.end();  // every rank done: all it sent
//                                          // has been received, so counted
class HostTxMeter {
 public:
  HostTxMeter(std::string iface, bool reader);
  void begin();
  uint64_t end();  // bytes since begin(); 0 on a non-reader
  bool reader() const { return reader_; }

 private:
  std::string iface_;
  bool reader_;
  uint64_t start_ = 0;
};

}  // namespace compcoll::bench
