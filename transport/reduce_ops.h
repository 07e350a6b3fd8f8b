// Element-wise reduction kernels handed to gloo::allreduce.
//
// Gloo's ring allreduce calls fn(out, a, b, n) with out == a or out == b,
// reducing two partial results of n elements at a time. The rules:
//   - float32 SUM is gloo::sum<float> itself, so compcoll's dense allreduce is
//     bit-for-bit Gloo's.
//   - float16 / bfloat16 widen each element to float, reduce, and round back
//     to nearest-even with compression/half.h (what PyTorch's CPU Gloo
//     backend gives).
//   - MIN/MAX on floating types propagate NaN (either input NaN -> NaN), so a
//     non-finite value is never hidden by a comparison that happens to drop it.
//   - Integer SUM/PROD wrap modulo 2^bits (computed in unsigned arithmetic, so
//     overflow is defined behaviour rather than UB).
#pragma once

#include <cstddef>
#include <cstdint>

#include "compcoll/types.h"

namespace compcoll {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for dtype/op. Throws Error(kInvalidArgument) for kAvg (the
// collectives layer divides after a SUM) and for values outside the enums.
ReduceFn reduce_function(DType dtype, ReduceOp op);

}  // namespace compcoll
