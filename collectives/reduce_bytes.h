// Element-wise acc = acc (op) in over n elements of dtype, for
// communicators that reduce gathered bytes themselves (the host
// hierarchy's LeaderComm, the tests' in-memory ThreadComm). MIN/MAX
// propagate NaN (a non-finite value is never dropped by a comparison);
// integer SUM/PROD wrap (unsigned math); fp16/bf16 widen, reduce and round
// back with compression/half.h. kAvg is refused (kInvalidArgument): the
// collectives divide after a SUM.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compcoll/types.h"

namespace compcoll {

void reduce_into(uint8_t* acc, const uint8_t* in, size_t n, DType dtype, ReduceOp op);

}  // namespace compcoll
