// The compcoll backend's counters, per group and per process.
//
//   group stats   one process group's: its lanes' Communicator stats plus
//                 the candidates handed to an inner backend directly, and
//                 the reduce-scatters it delegated (not compressed: see the
//                 FSDP warning in backend.h). compcoll.stats(group) returns
//                 them as JSON (group_stats_json).
//   process file  COMPCOLL_STATS_FILE, one per process, {rank} = the
//                 process's global rank. Every compcoll group of the process
//                 records its final stats in a process-wide book when it
//                 finishes, and the file is rewritten from the book each
//                 time: its top-level fields (calls, compressed_calls,
//                 dense_bytes, wire_bytes, ratio, time_ms, state_bytes;
//                 last_density, the last nonzero of the lanes') and
//                 "devices" sum every group, "groups" holds each group's own
//                 under its name (torch's group name: "0" for the default
//                 group). A program with one group reads as it did before
//                 groups were listed; subgroups no longer overwrite one
//                 another's file (nor, with their group ranks, another
//                 process's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plugin/stats.h"

namespace compcoll::torch_integration {

class Lane;

struct LaneStats {
  std::string name;
  StatsCounters counters;  // its Communicator's, and its direct calls as dense calls
  uint64_t state = 0;      // bytes of error-feedback state
  uint64_t direct = 0;     // calls that went past compcoll, dense (Lane::direct_calls)

  // Sums other in (several lanes, or groups, in one stats file).
  void add(const LaneStats& other);
};

struct GroupStats {
  std::string group;  // torch's group name
  int rank = 0;       // in the group
  int world_size = 0;
  std::string algo;
  std::vector<LaneStats> lanes;  // those with a Communicator or direct calls
  uint64_t reduce_scatter_calls = 0;
  uint64_t reduce_scatter_elems = 0;  // summed inputs: traffic left uncompressed
  // COMPCOLL_MOMENTUM_HANDOVER=auto: the momentum taken from the optimizer
  // (0: none, or not agreed yet), and whether it was moved out of the
  // optimizer (Adam's beta1) rather than handed over (SGD).
  float optimizer_momentum = 0.0f;
  bool optimizer_momentum_moved = false;
  // Loss-scale changes (torch.amp.GradScaler) the error-feedback state was
  // rescaled for (CompcollBackend::rescale_state).
  uint64_t loss_scale_changes = 0;
};

// A lane's counters (worker only: reads its Communicator); false when the
// lane has neither a Communicator nor direct calls.
bool read_lane_stats(const Lane& lane, LaneStats* out);

// compcoll.stats(group): rank, world_size, algo, group, the sums over the
// lanes, reduce_scatter_calls/_elems, optimizer_momentum(_moved),
// loss_scale_changes, and "devices" with each lane's own
// (the same fields plus direct_calls).
std::string group_stats_json(const GroupStats& g);

// Records g (once per backend; under "NAME (2)", "NAME (3)", ... when an
// earlier group of the process had its name) and rewrites the process file
// `path` ({rank} already replaced) for global rank `rank` of `world_size`.
// Returns false when the file cannot be written.
bool record_group_stats(const std::string& path, int rank, int world_size, const GroupStats& g);

}  // namespace compcoll::torch_integration
