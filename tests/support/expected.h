// What a lossy algorithm's first call (fresh error-feedback state) must
// deliver, recomputed without any communication from every rank's input:
// the same codecs, the same arithmetic, in rank order. Shared by the
// collectives and reliability tests.
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithm.h"

namespace compcoll::testing {

// dgc, sbc, sdagc: every rank's payload decoded in rank order into zeros.
std::vector<float> expected_sparse_sum(const std::string& algo, const AlgoParams& p,
                                       const std::vector<std::vector<float>>& inputs);

// onebit: worker quantization per shard, server sum and re-quantization.
std::vector<float> expected_onebit_sum(const AlgoParams& p,
                                       const std::vector<std::vector<float>>& inputs);

}  // namespace compcoll::testing
