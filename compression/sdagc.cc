#include "compression/sdagc.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "compcoll/error.h"
#include "compression/accumulate.h"
#include "compression/second_moment.h"
#include "compression/select.h"
#include "compression/simd.h"

namespace compcoll {
namespace {

using Moments = SdagcMoments;

// Pass 1: accumulate and gather the first two moments of v. Vector
// float partials per block keep it vectorised; blocks flush into doubles so
// the sums stay accurate over tens of millions of elements.
template <MomentumMode M>
Moments accumulate_moments(const float* g, float scale, float m, float* u, float* v, size_t n) {
  using simd::f32x4;
  constexpr size_t kBlock = 1024;
  const f32x4 sc = simd::splat(scale), mv = simd::splat(m);
  Moments mo;
  size_t i = 0;
  for (; i + simd::kLanes <= n;) {
    const size_t end = std::min(n - n % simd::kLanes, i + kBlock);
    f32x4 s = {}, q = {};
    for (; i < end; i += simd::kLanes) {
      const f32x4 gi = simd::load(g + i) * sc;
      const f32x4 inc = momentum_step4<M>(gi, u, i, mv);
      const f32x4 vi = simd::load(v + i) + inc;
      simd::store(v + i, vi);
      s += vi;
      q += vi * vi;
    }
    mo.sum += simd::sum(s);
    mo.sum_sq += simd::sum(q);
  }
  float dummy_u = 0.0f;
  for (; i < n; ++i) {
    float& ui = M == MomentumMode::kNone ? dummy_u : u[i];
    const float vi = v[i] + momentum_step<M>(g[i] * scale, ui, m);
    v[i] = vi;
    mo.sum += vi;
    mo.sum_sq += double(vi) * vi;
  }
  return mo;
}

// Moments over the finite elements only: a NaN or Inf must still be sent
// (it is selected as the largest key) without blinding the threshold.
Moments finite_moments(const float* v, size_t n, size_t* finite_count) {
  Moments mo;
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) {
      mo.sum += v[i];
      mo.sum_sq += double(v[i]) * v[i];
      ++c;
    }
  }
  *finite_count = c;
  return mo;
}

}  // namespace

double sdagc_sigma(const SdagcMoments& mo, size_t n) {
  if (n == 0) return 0.0;
  const double mean = mo.sum / double(n);
  const double var = mo.sum_sq / double(n) - mean * mean;
  if (std::isnan(var)) return var;
  return std::sqrt(std::max(0.0, var));
}

double gaussian_two_sided_quantile(double density) {
  // Invert erfc(x / sqrt 2) = density by bisection: no tables, exact enough.
  double lo = 0.0, hi = 40.0;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (std::erfc(mid / std::sqrt(2.0)) > density) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

SdagcCodec::SdagcCodec(const SdagcConfig& config) : config_(config) {
  validate_sparsify_config(config, "sdagc");
}

std::unique_ptr<CodecState> SdagcCodec::make_state(size_t n) const {
  auto st = make_sparsify_state(config_, n);
  st->lambda = static_cast<float>(gaussian_two_sided_quantile(config_.density));
  return st;
}

EncodeInfo SdagcCodec::encode(const float* grad, size_t n, CodecState& st, Bytes& payload) const {
  CC_CHECK_EQ(st.size(), n, kInvalidArgument, "sdagc: state was made for another tensor size");
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps, config_.warmup_shape);
  info.wanted = target_count(info.density, n);
  const MomentumMode mode = momentum_mode(config_.momentum, config_.nesterov);
  const float scale = clip_scale(grad, n, config_.clip, config_.world_size);
  float* v = st.v.data();

  // The array the selection ranks, and whose sigma sets the threshold: v,
  // or its normalized view (second_moment.h).
  const float* keys = v;
  std::unique_ptr<float[]> view;
  Moments mo;
  double sigma = 0.0;
  if (config_.second_moment_beta > 0.0f) {
    view = accumulate_normalized(mode, grad, scale, config_.momentum, st,
                                 config_.second_moment_beta, n);
    keys = view.get();
    size_t finite = 0;
    mo = finite_moments(keys, n, &finite);
    sigma = sdagc_sigma(mo, finite);
  } else {
    mo = dispatch_momentum(mode, [&](auto mc) {
      return accumulate_moments<decltype(mc)::value>(grad, scale, config_.momentum, st.u.data(), v,
                                                     n);
    });
    sigma = sdagc_sigma(mo, n);
    if (!std::isfinite(sigma)) {
      size_t finite = 0;
      mo = finite_moments(v, n, &finite);
      sigma = sdagc_sigma(mo, finite);
    }
  }
  // During warm-up the density changes stage by stage; restart lambda from
  // the Gaussian quantile of the stage's density rather than the last one.
  float lambda = st.lambda;
  if (info.density != config_.density) {
    lambda = static_cast<float>(gaussian_two_sided_quantile(info.density));
  }
  const float t = std::max(static_cast<float>(lambda * sigma), kMinThreshold);

  std::vector<uint32_t> cand;
  const size_t cap = candidate_cap(info.wanted);
  const size_t count = scan_candidates(keys, n, t, SelectKey::kMagnitude, cand, cap);
  const SelectionTarget target{info.wanted, (info.wanted * 4 + 4) / 5,
                               (info.wanted * 13 + 9) / 10};
  // Rescans need a sample to pick lower or higher thresholds from; take a
  // cheap one only when the count is off.
  std::vector<float> sample;
  const double pass_fraction = n ? double(info.wanted) / double(n) : 1.0;
  if (count < target.low || count > cand.size()) {
    const SamplePlan plan = SamplePlan::make(n, 0.01, st.steps);
    for (size_t i = plan.offset; i < n; i += plan.stride) {
      sample.push_back(select_key<SelectKey::kMagnitude>(keys[i]));
    }
  }
  info.threshold = finalize_selection(keys, n, target, SelectKey::kMagnitude, sample, pass_fraction,
                                      t, count, cand);
  info.sent = cand.size();

  // Next step's lambda: just below the one that would have selected exactly
  // k elements now.
  if (sigma > 0.0 && std::isfinite(sigma)) {
    const float kth = key_at_rank(cand, keys, info.wanted, SelectKey::kMagnitude);
    const double at_k = kth > 0.0f && std::isfinite(kth) ? kth : info.threshold;
    const double next = kSdagcLambdaHeadroom * at_k / sigma;
    if (std::isfinite(next) && next > 0.0) st.lambda = static_cast<float>(next);
  }
  emit_sparse(cand, st, n, config_.encoding, info.density <= config_.mask_density, payload);
  ++st.steps;
  return info;
}

}  // namespace compcoll
