// `compcoll-bench codec`: one process, one thread, one codec at a time, timed
// against memcpy of the same buffer in the same run.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/algorithm.h"

namespace compcoll::bench {

int codec_main(int argc, char** argv, int first);

// One codec (dgc, sbc, sdagc, csc, onebit) on `count` elements of a gaussian
// gradient, timed as `codec` times it (median of iters, one thread), with
// the settings of `params` (density, csc chunk and fraction, onebit block).
// `compcoll-bench project` feeds these speeds to the cost model.
struct CodecSpeed {
  double encode_ms = 0.0;
  double decode_ms = 0.0;
  double memcpy_ms = 0.0;  // the same buffer, the same run
  size_t payload_bytes = 0;
  size_t sent = 0;         // entries (sparse) or elements sent
};
CodecSpeed measure_codec(const std::string& algo, size_t count, const AlgoParams& params, int iters);

}  // namespace compcoll::bench
