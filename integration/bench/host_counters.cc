#include "integration/bench/host_counters.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "compcoll/error.h"

namespace compcoll::bench {

uint64_t parse_tx_bytes(const std::string& proc_net_dev, const std::string& iface) {
  // Two header lines, then "  IFACE: rx_bytes rx_packets rx_errs rx_drop
  // rx_fifo rx_frame rx_compressed rx_multicast tx_bytes ...".
  std::istringstream in(proc_net_dev);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto first = line.find_first_not_of(' ');
    if (line.substr(first, colon - first) != iface) continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t v = 0;
    for (int i = 0; i < 9; ++i) {
      CC_CHECK(static_cast<bool>(fields >> v), kInternal, "/proc/net/dev: cannot read the tx_bytes of ",
               iface, " from '", line, "'");
    }
    return v;  // the ninth number
  }
  CC_THROW(kInvalidArgument, "network interface '", iface,
           "' not found in this process's network namespace (/proc/self/net/dev)");
}

uint64_t interface_tx_bytes(const std::string& iface) {
  std::ifstream f("/proc/self/net/dev");
  CC_CHECK(f.good(), kUnsupported, "cannot read /proc/self/net/dev (interface counters)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_tx_bytes(ss.str(), iface);
}

std::string default_host_identity() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  struct stat st{};
  CC_CHECK(stat("/proc/self/ns/net", &st) == 0, kUnsupported,
           "cannot stat /proc/self/ns/net (network namespace identity)");
  return (boot.empty() ? std::string("unknown-boot") : boot) + "/" + std::to_string(st.st_ino);
}

HostTxMeter::HostTxMeter(std::string iface, bool reader) : iface_(std::move(iface)), reader_(reader) {
  if (reader_) start_ = interface_tx_bytes(iface_);  // a missing interface fails before traffic
}

void HostTxMeter::begin() {
  if (reader_) start_ = interface_tx_bytes(iface_);
}

uint64_t HostTxMeter::end() {
  if (!reader_) return 0;
  const uint64_t now = interface_tx_bytes(iface_);
  return now >= start_ ? now - start_ : 0;  // 64-bit counters do not wrap in a run
}

}  // namespace compcoll::bench
