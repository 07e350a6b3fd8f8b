// Threshold selection shared by the sparsifying codecs (dgc, sdagc, sbc).
//
// Terms:
//   key(x)     what an element is ranked by: |x| for dgc/sdagc (NaN and Inf
//              rank highest, so non-finite values are sent and never buried
//              in the residual), +x or -x for the two sides of sbc.
//   k          the number of elements the step should send (density * n).
//   candidate  an element whose key passed the step's threshold t.
//
// A codec finds t cheaply (a strided sample, or lambda * sigma), collects
// candidates in its fused pass, and hands them to finalize_selection, which
// enforces the count: too many are trimmed to the exact top-k among the
// candidates (by key, ties to the lower index; never by position), too few
// trigger a rescan at a lower threshold. Indices come out sorted.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "compression/simd.h"

namespace compcoll {

enum class SelectKey { kMagnitude, kPositive, kNegative };

template <SelectKey K>
inline float select_key(float x) {
  if constexpr (K == SelectKey::kMagnitude) {
    const float a = std::fabs(x);
    return a == a ? a : std::numeric_limits<float>::infinity();
  } else if constexpr (K == SelectKey::kPositive) {
    return x;
  } else {
    return -x;
  }
}

// key(x) >= t, written so that NaN passes for magnitude keys. The signed
// keys (sbc's sides) never pass a non-finite value: sbc sends those apart.
template <SelectKey K>
inline bool passes(float x, float t) {
  constexpr float kMax = std::numeric_limits<float>::max();
  if constexpr (K == SelectKey::kMagnitude) return !(std::fabs(x) < t);
  else if constexpr (K == SelectKey::kPositive) return x >= t && x <= kMax;
  else return -x >= t && -x <= kMax;
}

// passes() on a vector: all-ones lanes where the key passes.
template <SelectKey K>
inline simd::i32x4 passes4(simd::f32x4 x, simd::f32x4 t) {
  const simd::f32x4 max = simd::splat(std::numeric_limits<float>::max());
  if constexpr (K == SelectKey::kMagnitude) return ~(simd::abs(x) < t);
  else if constexpr (K == SelectKey::kPositive) return (x >= t) & (x <= max);
  else return (-x >= t) & (-x <= max);
}

// The smallest threshold ever used: zero keys are never worth sending.
constexpr float kMinThreshold = std::numeric_limits<float>::denorm_min();

// Positions of a strided sample over n elements: about `fraction` of them,
// at least min(n, kMinSample), offset rotating with the step so a periodic
// gradient cannot hide from it.
struct SamplePlan {
  size_t stride = 1;
  size_t offset = 0;
  static constexpr size_t kMinSample = 4096;
  static SamplePlan make(size_t n, double fraction, uint64_t step);
};

// Threshold such that about pass_fraction of the sample keys are >= it.
// Reorders sample. Never below kMinThreshold.
float sample_threshold(std::vector<float>& sample, double pass_fraction);

// Appends to out the indices in [0, n) whose key passes t. Stops appending
// once out holds cap entries but keeps counting; returns the full count.
size_t scan_candidates(const float* v, size_t n, float t, SelectKey key,
                       std::vector<uint32_t>& out, size_t cap);

// Keeps the k candidates with the largest keys (ties to the lower index) and
// sorts them by index.
void keep_top_k(std::vector<uint32_t>& cand, const float* v, size_t k, SelectKey key);

struct SelectionTarget {
  size_t k;            // wanted count
  size_t low;          // fewer than this triggers a rescan at a lower threshold
  size_t high;         // more than this is trimmed to exactly k
};

// Inputs: v (n elements, already updated for this step), the candidates a
// fused pass collected at threshold t with `count` the number that passed
// (count > cand.size() when the collection hit its cap), and the sample keys
// to lower the threshold from. On return cand holds the sorted selection.
// Returns the threshold that produced it.
float finalize_selection(const float* v, size_t n, SelectionTarget target, SelectKey key,
                         std::vector<float>& sample, double sample_pass_fraction, float t,
                         size_t count, std::vector<uint32_t>& cand);

// Exact top-k over all n elements (ties to the lower index), sorted by
// index; the slow path. Returns the k-th largest key.
float exact_top_k(const float* v, size_t n, size_t k, SelectKey key, std::vector<uint32_t>& out);

// The k-th largest key among the candidates, or 0 if there are fewer.
float key_at_rank(const std::vector<uint32_t>& cand, const float* v, size_t k, SelectKey key);

// Candidate buffers are capped at this multiple of k (plus slack) so a bad
// threshold estimate costs a rescan, never n indices of memory.
size_t candidate_cap(size_t k);

}  // namespace compcoll
