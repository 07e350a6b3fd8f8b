// The interposer's COMPCOLL_STATS_FILE: one JSON object per process and
// origin rank (the rank in the root communicator the others were split
// from), so one file per rank in the usual one-process-per-GPU job:
//
//   {"rank": 0, "world_size": 4, "algo": "dgc", "calls": .., "compressed_calls": ..,
//    "warmup_dense_calls": .., "steady_calls": .., "steady_ratio": ..,
//    "dense_bytes": .., "wire_bytes": .., "ratio": .., "time_ms": ..,
//    "last_density": .., "forwarded_calls": .., "state_bytes": .., "communicators": [
//      {"id": 0, "parent": -1, "rank": 0, "size": 4, "calls": .., ...,
//       "forwarded_calls": .., "state_entries": .., "state_bytes": .., "destroyed": true}, ...]}
//
// (the counters as plugin/stats.h's write_counters_json spells them)
//
// The top-level fields are the sums over its communicators (what DESIGN.md
// asks of every integration); each communicator's own line follows.
#pragma once

#include <string>
#include <vector>

#include "plugin/nccl_interposer/comm_entry.h"

namespace compcoll::interposer {

std::string stats_json(const std::string& algo, int origin_rank,
                       const std::vector<CommSnapshot>& comms);

}  // namespace compcoll::interposer
