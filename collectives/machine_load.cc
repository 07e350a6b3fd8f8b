#include "collectives/machine_load.h"

#include <algorithm>
#include <map>

#include "compcoll/error.h"

namespace compcoll {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::vector<MachineLoad> machine_loads(const std::vector<std::string>& reports) {
  std::vector<MachineLoad> out;
  std::vector<std::vector<bool>> cpus;  // per machine: the union of the bitmaps
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < reports.size(); ++r) {
    const std::string& rep = reports[r];
    const size_t bar = rep.rfind('|');
    CC_CHECK(bar != std::string::npos && bar > 0 && bar + 1 < rep.size(), kInvalidArgument,
             "rank ", r, "'s machine report '", rep.substr(0, 80),
             "' is not '<machine>|<CPU bitmap>'");
    std::string machine = rep.substr(0, bar);
    if (machine == "unknown") machine += ":" + std::to_string(r);
    const auto [it, fresh] = index.emplace(machine, out.size());
    if (fresh) {
      out.push_back({rep.substr(0, bar), 0, 0});
      cpus.emplace_back();
    }
    out[it->second].ranks += 1;
    std::vector<bool>& set = cpus[it->second];
    const std::string hex = rep.substr(bar + 1);
    for (size_t i = 0; i < hex.size(); ++i) {
      const int v = hex_digit(hex[i]);
      CC_CHECK(v >= 0, kInvalidArgument, "rank ", r, "'s CPU bitmap '", hex.substr(0, 80),
               "' is not hexadecimal");
      const size_t base = (hex.size() - 1 - i) * 4;  // the last digit holds CPUs 0-3
      for (int b = 0; b < 4; ++b) {
        if (!(v >> b & 1)) continue;
        const size_t c = base + static_cast<size_t>(b);
        if (set.size() <= c) set.resize(c + 1, false);
        set[c] = true;
      }
    }
  }
  for (size_t m = 0; m < out.size(); ++m) {
    for (const bool on : cpus[m]) out[m].cpus += on ? 1 : 0;
  }
  return out;
}

const MachineLoad& busiest_machine(const std::vector<MachineLoad>& loads) {
  CC_CHECK(!loads.empty(), kInternal, "no machine loads to compare");
  const MachineLoad* busiest = &loads.front();
  for (const MachineLoad& m : loads) {
    // ranks / cpus, compared without division (cpus can be 0 in a report).
    if (static_cast<long long>(m.ranks) * busiest->cpus >
        static_cast<long long>(busiest->ranks) * m.cpus) {
      busiest = &m;
    }
  }
  return *busiest;
}

std::vector<MachineLoad> exchange_machine_loads(Comm& world, const std::string& my_report) {
  return machine_loads(gather_strings(world, my_report, kMaxMachineReportBytes, "machine report"));
}

MachineLoad machine_of(const std::vector<MachineLoad>& loads, const std::string& my_report) {
  const MachineLoad mine = machine_loads({my_report}).front();
  if (mine.machine != "unknown") {
    for (const MachineLoad& m : loads) {
      if (m.machine == mine.machine) return m;
    }
  }
  return mine;
}

int staged_codec_threads(const MachineLoad& machine) {
  const int per_rank = machine.ranks > 0 ? machine.cpus / machine.ranks : machine.cpus;
  return std::clamp(per_rank, 1, kMaxStagedCodecThreads);
}

}  // namespace compcoll
