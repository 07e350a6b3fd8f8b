// Results of `compcoll-bench allreduce` and their two renderings: the JSON
// list of DESIGN.md's contract and an nccl-tests-style table.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace compcoll::bench {

struct AllreduceResult {
  std::string algo;
  std::string hierarchy = "off";  // "host" / "shards": the row ran behind the host hierarchy
  int ranks = 0;
  size_t count = 0;
  int iters = 0;
  double time_ms = 0.0;        // median over iterations of the slowest rank
  double dense_time_ms = 0.0;  // Gloo's own allreduce, same run
  // CPU time of a call summed over all ranks (every thread of each rank's
  // process), median over iterations: what the call costs the machine. With
  // more ranks than cores, time_ms cannot fall below cpu_ms / cores.
  double cpu_ms = 0.0;
  double dense_cpu_ms = 0.0;  // the same for Gloo's own allreduce
  uint64_t wire_bytes = 0;     // sent per rank per call (measured)
  uint64_t dense_wire_bytes = 0;  // a ring allreduce's bytes per rank
  double rel_error = 0.0;      // last call vs the exact sum
  double running_rel_error = 0.0;  // sum over all calls vs calls * exact sum
  bool identical = false;      // all ranks bitwise equal
  std::string decision;        // auto: what the last call chose and why
  // With --link only (host_counters.h): the most bytes any namespace's
  // interface sent per timed call, and how the ranks were placed.
  bool has_host_tx = false;
  uint64_t host_tx_bytes = 0;
  int ranks_per_host = 1;
  int hosts = 0;               // distinct host identities the ranks reported
  // With --probe-link: auto's link terms measured before the algorithms ran
  // (collectives/auto.h); negative when not measured.
  double link_alpha_ms = -1.0;
  double link_alpha_ring_ms = -1.0;
  double link_beta_ns = -1.0;  // per byte

  // Dense bytes / wire bytes; NaN (JSON null, "n/a" in the table) when a
  // dense allreduce would send nothing: one rank, or zero elements.
  double ratio() const {
    return dense_wire_bytes && wire_bytes ? double(dense_wire_bytes) / double(wire_bytes) : NAN;
  }
  // The table's name of the row: "dgc+host" behind the hierarchy.
  std::string label() const { return hierarchy == "off" ? algo : algo + "+" + hierarchy; }
  double speedup() const { return time_ms > 0 ? dense_time_ms / time_ms : 0.0; }
};

std::string results_json(const std::vector<AllreduceResult>& results);
std::string results_table(const std::vector<AllreduceResult>& results);

}  // namespace compcoll::bench
