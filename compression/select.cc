#include "compression/select.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace compcoll {
namespace {

template <SelectKey K>
size_t scan_impl(const float* v, size_t n, float t, std::vector<uint32_t>& out, size_t cap) {
  size_t count = 0;
  constexpr size_t kBlock = 16;
  size_t i0 = 0;
  const simd::f32x4 tv = simd::splat(t);
  for (; i0 + kBlock <= n; i0 += kBlock) {
    simd::i32x4 hit = {};
    for (size_t i = i0; i < i0 + kBlock; i += simd::kLanes) hit |= passes4<K>(simd::load(v + i), tv);
    if (!simd::any(hit)) continue;
    for (size_t i = i0; i < i0 + kBlock; ++i) {
      if (passes<K>(v[i], t)) {
        if (out.size() < cap) out.push_back(static_cast<uint32_t>(i));
        ++count;
      }
    }
  }
  for (size_t i = i0; i < n; ++i) {
    if (passes<K>(v[i], t)) {
      if (out.size() < cap) out.push_back(static_cast<uint32_t>(i));
      ++count;
    }
  }
  return count;
}

template <SelectKey K>
void keep_top_k_impl(std::vector<uint32_t>& cand, const float* v, size_t k) {
  // Non-finite values (key +inf) are always kept, even beyond k: a NaN or
  // Inf must reach the output and must never stay in a residual.
  size_t non_finite = 0;
  for (const uint32_t i : cand) non_finite += std::isinf(select_key<K>(v[i]));
  k = std::max(k, non_finite);
  if (cand.size() > k) {
    // Rank by key descending, then index ascending: deterministic, and the
    // position never decides between different magnitudes.
    std::vector<std::pair<float, uint32_t>> keyed(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) keyed[i] = {select_key<K>(v[cand[i]]), cand[i]};
    auto before = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::nth_element(keyed.begin(), keyed.begin() + k, keyed.end(), before);
    cand.resize(k);
    for (size_t i = 0; i < k; ++i) cand[i] = keyed[i].second;
  }
  std::sort(cand.begin(), cand.end());
}

template <SelectKey K>
float key_at_rank_impl(const std::vector<uint32_t>& cand, const float* v, size_t k) {
  if (k == 0 || cand.size() < k) return 0.0f;
  std::vector<float> keys(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) keys[i] = select_key<K>(v[cand[i]]);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<float>());
  return keys[k - 1];
}

// Exact selection over the whole tensor: the k largest keys, ties to the
// lower index. Costs a copy of n keys; reached only when sampling misled the
// threshold several times in a row or ties are massive.
template <SelectKey K>
float exact_top_k_impl(const float* v, size_t n, size_t k, std::vector<uint32_t>& out) {
  out.clear();
  k = std::min(k, n);
  if (k == 0) return kMinThreshold;
  std::vector<float> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = select_key<K>(v[i]);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<float>());
  const float t = std::max(keys[k - 1], kMinThreshold);
  if (std::isinf(t)) {  // k or more non-finite values: send every one of them
    for (size_t i = 0; i < n; ++i) {
      if (std::isinf(select_key<K>(v[i]))) out.push_back(static_cast<uint32_t>(i));
    }
    return t;
  }
  size_t above = 0;  // keys strictly above t: fewer than k of them
  for (size_t i = 0; i < n; ++i) above += select_key<K>(v[i]) > t;
  size_t ties_left = k - std::min(k, above);
  for (size_t i = 0; i < n; ++i) {
    const float key = select_key<K>(v[i]);
    if (key > t || (key == t && ties_left > 0 && (--ties_left, true))) {
      out.push_back(static_cast<uint32_t>(i));
    }
  }
  return t;
}

template <typename Fn>
auto dispatch(SelectKey key, Fn&& fn) {
  switch (key) {
    case SelectKey::kPositive: return fn(std::integral_constant<SelectKey, SelectKey::kPositive>{});
    case SelectKey::kNegative: return fn(std::integral_constant<SelectKey, SelectKey::kNegative>{});
    default: return fn(std::integral_constant<SelectKey, SelectKey::kMagnitude>{});
  }
}

}  // namespace

SamplePlan SamplePlan::make(size_t n, double fraction, uint64_t step) {
  SamplePlan p;
  if (n <= kMinSample || fraction >= 1.0) return p;  // sample everything
  size_t stride = fraction > 0.0 ? static_cast<size_t>(1.0 / fraction) : n;
  stride = std::max<size_t>(1, std::min(stride, n / kMinSample));
  p.stride = stride;
  p.offset = static_cast<size_t>((step * 7919u) % stride);
  return p;
}

float sample_threshold(std::vector<float>& sample, double pass_fraction) {
  if (sample.empty()) return kMinThreshold;
  size_t want = static_cast<size_t>(std::ceil(pass_fraction * static_cast<double>(sample.size())));
  want = std::clamp<size_t>(want, 1, sample.size());
  std::nth_element(sample.begin(), sample.begin() + (want - 1), sample.end(),
                   std::greater<float>());
  return std::max(sample[want - 1], kMinThreshold);
}

size_t scan_candidates(const float* v, size_t n, float t, SelectKey key,
                       std::vector<uint32_t>& out, size_t cap) {
  return dispatch(key, [&](auto k) { return scan_impl<decltype(k)::value>(v, n, t, out, cap); });
}

void keep_top_k(std::vector<uint32_t>& cand, const float* v, size_t k, SelectKey key) {
  dispatch(key, [&](auto kk) {
    keep_top_k_impl<decltype(kk)::value>(cand, v, k);
    return 0;
  });
}

float key_at_rank(const std::vector<uint32_t>& cand, const float* v, size_t k, SelectKey key) {
  return dispatch(key, [&](auto kk) { return key_at_rank_impl<decltype(kk)::value>(cand, v, k); });
}

size_t candidate_cap(size_t k) { return 8 * k + 1024; }

float finalize_selection(const float* v, size_t n, SelectionTarget target, SelectKey key,
                         std::vector<float>& sample, double sample_pass_fraction, float t,
                         size_t count, std::vector<uint32_t>& cand) {
  if (target.k == 0) {
    cand.clear();
    return t;
  }
  const size_t cap = candidate_cap(target.k);
  constexpr int kMaxRescans = 6;
  constexpr double kHeadroom = 1.2;
  double fraction = sample_pass_fraction;
  for (int attempt = 0;; ++attempt) {
    const bool complete = count <= cand.size();
    if (complete && count > target.high) {
      keep_top_k(cand, v, target.k, key);
      return t;
    }
    // Enough, or every non-zero key is already taken.
    if (complete && (count >= target.low || t <= kMinThreshold)) {
      std::sort(cand.begin(), cand.end());
      return t;
    }
    if (attempt == kMaxRescans) {
      // The sample kept misleading us (a periodic gradient, massive ties):
      // select exactly, whatever it costs.
      return exact_top_k(v, n, target.k, key, cand);
    }
    if (!complete) {
      // Far too many to hold. The held candidates are a large sample of
      // exactly the keys that matter (those near t): raise t to the key that
      // about k * headroom of the full count would pass.
      const double want = kHeadroom * double(target.k) / double(count);
      const float raised = key_at_rank(cand, v, std::max<size_t>(1, size_t(want * cand.size())), key);
      t = raised > t ? raised : t * 2.0f;
    } else {  // too few: lower it
      fraction = std::min(1.0, fraction * 4);
      const float lowered = sample_threshold(sample, fraction);
      t = std::max(lowered < t ? lowered : t * 0.5f, kMinThreshold);
    }
    cand.clear();
    count = scan_candidates(v, n, t, key, cand, cap);
  }
}

float exact_top_k(const float* v, size_t n, size_t k, SelectKey key, std::vector<uint32_t>& out) {
  return dispatch(key, [&](auto kk) { return exact_top_k_impl<decltype(kk)::value>(v, n, k, out); });
}

}  // namespace compcoll
