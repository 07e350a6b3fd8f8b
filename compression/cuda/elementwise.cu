#include <algorithm>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda/device_math.h"
#include "compression/cuda/elementwise.h"
#include "compression/half.h"

namespace compcoll::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t n) {
  return unsigned(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, 4096 * 32));
}

__global__ void scale_kernel(float* d, size_t n, float factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    d[i] = fmul(d[i], factor);
  }
}

// The host's conversions (compression/half.h), not CUDA's intrinsics: a
// rank that stages a call converts with those, and every rank must write
// the same bits, NaN payloads included.
__global__ void widen_kernel(const uint16_t* src, float* dst, size_t n, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = bf16 ? bf16_to_float(src[i]) : half_to_float(src[i]);  // both exact
  }
}

__global__ void narrow_kernel(const float* src, uint16_t* dst, size_t n, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = bf16 ? float_to_bf16(src[i]) : float_to_half(src[i]);
  }
}

}  // namespace

void scale_gpu(float* d, size_t n, float factor, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(d, n, factor);
  check(cudaGetLastError(), "scale_kernel");
}

void widen_gpu(const void* src, float* dst, size_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  widen_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(src), dst, n, bf16);
  check(cudaGetLastError(), "widen_kernel");
}

void narrow_gpu(const float* src, void* dst, size_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  narrow_kernel<<<grid_for(n), kThreads, 0, s>>>(src, static_cast<uint16_t*>(dst), n, bf16);
  check(cudaGetLastError(), "narrow_kernel");
}

}  // namespace compcoll::cuda
