// The control flow of compression/select.cc's finalize_selection, over an
// abstract set of operations, so that the GPU codecs (GpuSelector, device
// data) take exactly the CPU's decisions: same thresholds, same rescans,
// same selection. tests/gpu checks it against finalize_selection on the CPU
// with a host implementation of the operations that works the GPU's way
// (sorting instead of nth_element).
//
// Ops must provide:
//   size_t held() const            candidates currently held
//   void clear()
//   void keep_top_k(size_t k)      exact top-k of the held (non-finite kept
//                                  beyond k), sorted by index
//   void sort_by_index()
//   float exact_top_k(size_t k)    over the whole tensor; returns its threshold
//   float key_at_rank(size_t r)    r-th largest held key, 0 if fewer
//   float sample_threshold(double fraction)
//   size_t scan(float t, size_t cap)   held = first cap passing t in index
//                                      order; returns how many passed
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "compression/select.h"

namespace compcoll::cuda {

// The constants of select.cc's finalize_selection (file-local there): the
// CPU test fails if they drift apart.
constexpr int kMaxRescans = 6;
constexpr double kRescanHeadroom = 1.2;

template <typename Ops>
float finalize_selection_with(Ops& ops, SelectionTarget target, double sample_pass_fraction,
                              float t, size_t count) {
  if (target.k == 0) {
    ops.clear();
    return t;
  }
  const size_t cap = candidate_cap(target.k);
  double fraction = sample_pass_fraction;
  for (int attempt = 0;; ++attempt) {
    const bool complete = count <= ops.held();
    if (complete && count > target.high) {
      ops.keep_top_k(target.k);
      return t;
    }
    if (complete && (count >= target.low || t <= kMinThreshold)) {
      ops.sort_by_index();
      return t;
    }
    if (attempt == kMaxRescans) return ops.exact_top_k(target.k);
    if (!complete) {
      const double want = kRescanHeadroom * double(target.k) / double(count);
      const float raised = ops.key_at_rank(std::max<size_t>(1, size_t(want * double(ops.held()))));
      t = raised > t ? raised : t * 2.0f;
    } else {
      fraction = std::min(1.0, fraction * 4);
      const float lowered = ops.sample_threshold(fraction);
      t = std::max(lowered < t ? lowered : t * 0.5f, kMinThreshold);
    }
    count = ops.scan(t, cap);
  }
}

}  // namespace compcoll::cuda
