// Element-wise kernels of the sparsifying codecs (dgc, sdagc, sbc), as
// launchers callable from host code. Momentum mode M: 0 none, 1 plain,
// 2 Nesterov. Every launcher enqueues on `s` and returns at once.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace compcoll::cuda::detail {

// Where a strided sample (compression/select.h's SamplePlan) reads.
struct Strided {
  size_t offset;
  size_t stride;
  size_t count;
};

// dgc: out[j] = |v[i] + momentum increment of g[i]*scale| at i = offset + j*stride
// (u is not updated: the sample looks ahead at this step's values).
void dgc_sample(int mode, const float* g, float scale, float m, const float* u, const float* v,
                Strided at, float* out, cudaStream_t s);
// dgc: the fused pass. u, v updated in place; indices whose |v| passes t are
// appended to cand (up to cap, in no particular order) and all are counted.
void dgc_fused(int mode, const float* g, float scale, float m, float* u, float* v, size_t n, float t,
               uint32_t* cand, size_t cap, unsigned long long* count, cudaStream_t s);

// sdagc pass 1: accumulate, and per 1024-element block of the first n - n%4
// elements the float sums of v and v*v in the CPU's lane order; the last
// n%4 values of v go to tail (host sums them in double, as the CPU does).
size_t sdagc_blocks(size_t n);
void sdagc_accumulate(int mode, const float* g, float scale, float m, float* u, float* v, size_t n,
                      float* block_sum, float* block_sq, float* tail, cudaStream_t s);
// out[j] = |v[offset + j*stride]| (NaN as +inf).
void magnitude_sample(const float* v, Strided at, float* out, cudaStream_t s);

// sbc: x = v[i] + g[i] (0 when not finite) sampled into pos (x) and neg (-x).
void sbc_sample(const float* g, const float* v, Strided at, float* pos, float* neg, cudaStream_t s);
// sbc's fused pass: v += g; non-finite results go to odd, entries >= t_pos
// to pos, entries <= -t_neg to neg (each capped, each counted).
struct SbcLists {
  uint32_t* pos;
  uint32_t* neg;
  uint32_t* odd;
  unsigned long long* counts;  // [pos, neg, odd]
  size_t cap;
  size_t odd_cap;
};
void sbc_fused(const float* g, float* v, size_t n, float t_pos, float t_neg, SbcLists lists, cudaStream_t s);

// v[idx[j]] = value.
void set_at(float* v, const uint32_t* idx, size_t k, float value, cudaStream_t s);
// What a sparse payload sent leaves the residual: v[i] -= sent[j] (0 when
// either is not finite), and u[i] = 0 when masking (momentum factor masking)
// or where either is not finite, whose velocity restarts (u may be null).
void sparse_residual(float* v, float* u, const uint32_t* idx, const float* sent, size_t k, bool masking,
                     cudaStream_t s);

// Per-block partial sums of g[i]^2 in double, for the clipping norm (of the
// finite elements only, with finite_only); returns the number of partials
// written to partial (at most 1024).
size_t sum_squares(const float* g, size_t n, double* partial, cudaStream_t s,
                   bool finite_only = false);

}  // namespace compcoll::cuda::detail
