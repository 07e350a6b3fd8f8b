#include "transport/machine_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace compcoll {

namespace {

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id.empty() ? "unknown" : id;
}

// CPUs as bits, most significant hex digit first (the way taskset prints).
std::string hex_bitmap(const std::vector<bool>& cpus) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t hi = (cpus.size() + 3) / 4; hi-- > 0;) {
    int v = 0;
    for (int b = 3; b >= 0; --b) {
      const size_t c = hi * 4 + static_cast<size_t>(b);
      v = v * 2 + (c < cpus.size() && cpus[c] ? 1 : 0);
    }
    out += kDigits[v];
  }
  return out.empty() ? "0" : out;
}

std::vector<bool> affinity() {
  // Room for machines of up to 8192 CPUs; a larger one falls back to "all".
  constexpr int kMaxCpus = 8192;
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  const size_t bytes = CPU_ALLOC_SIZE(kMaxCpus);
  std::vector<bool> out;
  if (set != nullptr && sched_getaffinity(0, bytes, set) == 0) {
    for (int c = 0; c < kMaxCpus; ++c) {
      if (CPU_ISSET_S(c, bytes, set)) {
        out.resize(static_cast<size_t>(c) + 1, false);
        out[static_cast<size_t>(c)] = true;
      }
    }
  }
  if (set != nullptr) CPU_FREE(set);
  if (out.empty()) out.assign(static_cast<size_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))), true);
  return out;
}

}  // namespace

std::string describe_machine_cpus() { return boot_id() + "|" + hex_bitmap(affinity()); }

}  // namespace compcoll
