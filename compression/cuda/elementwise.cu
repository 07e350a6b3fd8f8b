#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda/device_math.h"
#include "compression/cuda/elementwise.h"

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

__global__ void widen_kernel(const uint16_t* src, float* dst, size_t n, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    // Both widenings are exact: bfloat16 is the top half of a float.
    dst[i] = bf16 ? __uint_as_float(uint32_t(src[i]) << 16) : __half2float(__ushort_as_half(src[i]));
  }
}

__global__ void narrow_kernel(const float* src, uint16_t* dst, size_t n, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(src[i])) : __half_as_ushort(__float2half_rn(src[i]));
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
