// Whole-tensor element-wise passes of the device route (collectives/cuda/):
// AVG's scaling and the fp16/bf16 <-> fp32 copies, with the host path's
// roundings (collectives/dense.cc's scale_in_place, compression/half.h), so
// a call on the device gives the bits of the same call staged through host
// memory. The one exception, as everywhere on the GPU: the bits of a NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace compcoll::cuda {

// d[i] = d[i] * factor, one rounding (never fused with anything).
void scale_gpu(float* d, size_t n, float factor, cudaStream_t s);
// dst[i] = src[i] widened from IEEE binary16 (bf16 false) or bfloat16: exact.
void widen_gpu(const void* src, float* dst, size_t n, bool bf16, cudaStream_t s);
// dst[i] = src[i] narrowed to binary16 or bfloat16, round to nearest even.
void narrow_gpu(const float* src, void* dst, size_t n, bool bf16, cudaStream_t s);

}  // namespace compcoll::cuda
