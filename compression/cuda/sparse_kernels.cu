#include <algorithm>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda/device_math.h"
#include "compression/cuda/sparse_kernels.h"

namespace compcoll::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMomentsBlock = 1024;  // sdagc.cc's kBlock

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks == 0 ? 1 : (blocks < 4096 * 32 ? blocks : 4096 * 32));
}

// Grid-stride loops: for (size_t i = first(); i < n; i += step()).
__device__ __forceinline__ size_t first() { return blockIdx.x * size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t step() { return size_t(gridDim.x) * blockDim.x; }

// Warp-aggregated append: one atomic per warp, positions beyond cap dropped
// (but counted).
__device__ void append(bool hit, uint32_t i, uint32_t* out, size_t cap, unsigned long long* count) {
  const unsigned active = __activemask();
  const unsigned mask = __ballot_sync(active, hit);
  if (mask == 0) return;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(mask) - 1;
  unsigned long long base = 0;
  if (lane == leader) base = atomicAdd(count, (unsigned long long)__popc(mask));
  base = __shfl_sync(active, base, leader);
  if (hit) {
    const unsigned long long pos = base + __popc(mask & ((1u << lane) - 1u));
    if (pos < cap) out[pos] = i;
  }
}

template <int M>
__global__ void dgc_sample_kernel(const float* g, float scale, float m, const float* u, const float* v,
                                  Strided at, float* out) {
  for (size_t j = first(); j < at.count; j += step()) {
    const size_t i = at.offset + j * at.stride;
    float ui = M == 0 ? 0.0f : u[i];
    out[j] = select_key<0>(fadd(v[i], momentum_step<M>(fmul(g[i], scale), ui, m)));
  }
}

template <int M>
__global__ void dgc_fused_kernel(const float* g, float scale, float m, float* u, float* v, size_t n,
                                 float t, uint32_t* cand, size_t cap, unsigned long long* count) {
  for (size_t i = first(); i < n; i += step()) {
    float ui = M == 0 ? 0.0f : u[i];
    const float x = fadd(v[i], momentum_step<M>(fmul(g[i], scale), ui, m));
    if (M != 0) u[i] = ui;
    v[i] = x;
    append(passes<0>(x, t), uint32_t(i), cand, cap, count);
  }
}

// One CUDA block per 1024-element block: every thread updates four
// consecutive elements, then four threads sum the lanes in the CPU's order.
template <int M>
__global__ void sdagc_kernel(const float* g, float scale, float m, float* u, float* v, size_t n4,
                             float* block_sum, float* block_sq) {
  __shared__ float vals[kMomentsBlock];
  __shared__ float lane_s[4], lane_q[4];
  const size_t base = size_t(blockIdx.x) * kMomentsBlock;
  const size_t len = n4 - base < kMomentsBlock ? n4 - base : kMomentsBlock;
  for (size_t e = threadIdx.x; e < len; e += blockDim.x) {
    const size_t i = base + e;
    float ui = M == 0 ? 0.0f : u[i];
    const float x = fadd(v[i], momentum_step<M>(fmul(g[i], scale), ui, m));
    if (M != 0) u[i] = ui;
    v[i] = x;
    vals[e] = x;
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    float s = 0.0f, q = 0.0f;
    for (size_t e = threadIdx.x; e < len; e += 4) {
      s = fadd(s, vals[e]);
      q = fadd(q, fmul(vals[e], vals[e]));
    }
    lane_s[threadIdx.x] = s;
    lane_q[threadIdx.x] = q;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    block_sum[blockIdx.x] = lane_total(lane_s);
    block_sq[blockIdx.x] = lane_total(lane_q);
  }
}

template <int M>
__global__ void sdagc_tail_kernel(const float* g, float scale, float m, float* u, float* v, size_t n4,
                                  size_t n, float* tail) {
  for (size_t i = n4; i < n; ++i) {
    float ui = M == 0 ? 0.0f : u[i];
    const float x = fadd(v[i], momentum_step<M>(fmul(g[i], scale), ui, m));
    if (M != 0) u[i] = ui;
    v[i] = x;
    tail[i - n4] = x;
  }
}

__global__ void magnitude_sample_kernel(const float* v, Strided at, float* out) {
  for (size_t j = first(); j < at.count; j += step()) { out[j] = select_key<0>(v[at.offset + j * at.stride]); }
}

__global__ void sbc_sample_kernel(const float* g, const float* v, Strided at, float* pos, float* neg) {
  for (size_t j = first(); j < at.count; j += step()) {
    const size_t i = at.offset + j * at.stride;
    float x = fadd(v[i], g[i]);
    if (!finite(x)) x = 0.0f;  // sent apart; must not set a threshold
    pos[j] = x;
    neg[j] = select_key<2>(x);
  }
}

__global__ void sbc_fused_kernel(const float* g, float* v, size_t n, float t_pos, float t_neg, SbcLists l) {
  for (size_t i = first(); i < n; i += step()) {
    const float x = fadd(v[i], g[i]);
    v[i] = x;
    const bool odd = !finite(x);
    const bool pos = !odd && x >= t_pos;
    const bool neg = !odd && !pos && select_key<2>(x) >= t_neg;
    append(pos, uint32_t(i), l.pos, l.cap, l.counts + 0);
    append(neg, uint32_t(i), l.neg, l.cap, l.counts + 1);
    append(odd, uint32_t(i), l.odd, l.odd_cap, l.counts + 2);
  }
}

__global__ void set_at_kernel(float* v, const uint32_t* idx, size_t k, float value) {
  for (size_t j = first(); j < k; j += step()) { v[idx[j]] = value; }
}

__global__ void sparse_residual_kernel(float* v, float* u, const uint32_t* idx, const float* sent, size_t k,
                                       bool masking) {
  for (size_t j = first(); j < k; j += step()) {
    const uint32_t i = idx[j];
    const float vi = v[i];
    const bool both_finite = finite(sent[j]) && finite(vi);
    v[i] = both_finite ? fsub(vi, sent[j]) : 0.0f;
    if (u != nullptr && (masking || !both_finite)) u[i] = 0.0f;
  }
}

__global__ void sum_squares_kernel(const float* g, size_t n, double* partial, bool finite_only) {
  __shared__ double warp_sums[kThreads / 32];
  double acc = 0.0;
  for (size_t i = first(); i < n; i += step()) {
    const double x = g[i];
    if (!finite_only || finite(g[i])) acc = dadd(acc, dmul(x, x));
  }
  for (int off = 16; off > 0; off >>= 1) acc = dadd(acc, __shfl_down_sync(0xffffffffu, acc, off));
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total = dadd(total, warp_sums[w]);
    partial[blockIdx.x] = total;
  }
}

template <typename Fn>
void with_mode(int mode, Fn&& fn) {
  switch (mode) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

}  // namespace

void dgc_sample(int mode, const float* g, float scale, float m, const float* u, const float* v,
                Strided at, float* out, cudaStream_t s) {
  if (at.count == 0) return;
  with_mode(mode, [&](auto mc) {
    dgc_sample_kernel<decltype(mc)::value><<<grid_for(at.count), kThreads, 0, s>>>(g, scale, m, u, v, at, out);
  });
  check(cudaGetLastError(), "dgc_sample");
}

void dgc_fused(int mode, const float* g, float scale, float m, float* u, float* v, size_t n, float t,
               uint32_t* cand, size_t cap, unsigned long long* count, cudaStream_t s) {
  if (n == 0) return;
  with_mode(mode, [&](auto mc) {
    dgc_fused_kernel<decltype(mc)::value><<<grid_for(n), kThreads, 0, s>>>(g, scale, m, u, v, n, t, cand, cap, count);
  });
  check(cudaGetLastError(), "dgc_fused");
}

size_t sdagc_blocks(size_t n) {
  const size_t n4 = n - n % 4;
  return (n4 + kMomentsBlock - 1) / kMomentsBlock;
}

void sdagc_accumulate(int mode, const float* g, float scale, float m, float* u, float* v, size_t n,
                      float* block_sum, float* block_sq, float* tail, cudaStream_t s) {
  const size_t n4 = n - n % 4;
  const size_t blocks = sdagc_blocks(n);
  with_mode(mode, [&](auto mc) {
    constexpr int M = decltype(mc)::value;
    if (blocks) sdagc_kernel<M><<<unsigned(blocks), kThreads, 0, s>>>(g, scale, m, u, v, n4, block_sum, block_sq);
    if (n4 < n) sdagc_tail_kernel<M><<<1, 1, 0, s>>>(g, scale, m, u, v, n4, n, tail);
  });
  check(cudaGetLastError(), "sdagc_accumulate");
}

void magnitude_sample(const float* v, Strided at, float* out, cudaStream_t s) {
  if (at.count == 0) return;
  magnitude_sample_kernel<<<grid_for(at.count), kThreads, 0, s>>>(v, at, out);
  check(cudaGetLastError(), "magnitude_sample");
}

void sbc_sample(const float* g, const float* v, Strided at, float* pos, float* neg, cudaStream_t s) {
  if (at.count == 0) return;
  sbc_sample_kernel<<<grid_for(at.count), kThreads, 0, s>>>(g, v, at, pos, neg);
  check(cudaGetLastError(), "sbc_sample");
}

void sbc_fused(const float* g, float* v, size_t n, float t_pos, float t_neg, SbcLists lists, cudaStream_t s) {
  if (n == 0) return;
  sbc_fused_kernel<<<grid_for(n), kThreads, 0, s>>>(g, v, n, t_pos, t_neg, lists);
  check(cudaGetLastError(), "sbc_fused");
}

void set_at(float* v, const uint32_t* idx, size_t k, float value, cudaStream_t s) {
  if (k == 0) return;
  set_at_kernel<<<grid_for(k), kThreads, 0, s>>>(v, idx, k, value);
  check(cudaGetLastError(), "set_at");
}

void sparse_residual(float* v, float* u, const uint32_t* idx, const float* sent, size_t k, bool masking,
                     cudaStream_t s) {
  if (k == 0) return;
  sparse_residual_kernel<<<grid_for(k), kThreads, 0, s>>>(v, u, idx, sent, k, masking);
  check(cudaGetLastError(), "sparse_residual");
}

size_t sum_squares(const float* g, size_t n, double* partial, cudaStream_t s, bool finite_only) {
  const size_t blocks = std::min<size_t>(1024, (n + kThreads - 1) / kThreads);
  if (blocks == 0) return 0;
  sum_squares_kernel<<<unsigned(blocks), kThreads, 0, s>>>(g, n, partial, finite_only);
  check(cudaGetLastError(), "sum_squares");
  return blocks;
}

}  // namespace compcoll::cuda::detail
