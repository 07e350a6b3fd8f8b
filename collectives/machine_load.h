// How many ranks each machine runs and how many CPUs they may use between
// them, from every rank's report (transport/machine_cpus.h). It decides
// COMPCOLL_HIERARCHY=auto: the host hierarchy queues every host's
// compression on its leader, which pays only where the ranks would otherwise
// contend for cores (docs/scaling.md, "When auto takes the hierarchy").
#pragma once

#include <string>
#include <vector>

#include "collectives/comm.h"

namespace compcoll {

// A report is "<machine>|<CPU bitmap in hex>"; this bounds it (a boot id and
// 8192 CPUs take 2085 bytes).
constexpr size_t kMaxMachineReportBytes = 4096;

struct MachineLoad {
  std::string machine;  // the kernel's boot id, or "unknown"
  int ranks = 0;        // world ranks running on it
  int cpus = 0;         // CPUs those ranks may run on: the union of their affinities
  bool oversubscribed() const { return ranks > cpus; }
};

// One entry per machine, in the order of its lowest rank. A report without
// '|' or with a non-hex bitmap is kInvalidArgument naming the rank. Ranks
// whose machine is "unknown" count as a machine each (nothing says they
// share one).
std::vector<MachineLoad> machine_loads(const std::vector<std::string>& reports);

// The machine with the most ranks per CPU (the first of equals); loads must
// not be empty. COMPCOLL_HIERARCHY=auto takes the hierarchy when it is
// oversubscribed: every rank decides from the same loads.
const MachineLoad& busiest_machine(const std::vector<MachineLoad>& loads);

// Collective over `world`: every rank's report, and the same loads on every
// rank.
std::vector<MachineLoad> exchange_machine_loads(Comm& world, const std::string& my_report);

// Among loads, the one of the machine my_report describes (a rank whose
// machine is "unknown" is a machine of its own: its report alone).
MachineLoad machine_of(const std::vector<MachineLoad>& loads, const std::string& my_report);

// COMPCOLL_CODEC_THREADS=auto for host-staged device tensors: the CPUs of
// the rank's machine shared among its ranks, at least 1, at most
// kMaxStagedCodecThreads (dgc's encode gains little beyond: docs/gpu.md).
inline constexpr int kMaxStagedCodecThreads = 8;
int staged_codec_threads(const MachineLoad& machine);

}  // namespace compcoll
