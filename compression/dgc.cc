#include "compression/dgc.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <thread>

#include "compcoll/error.h"
#include "compression/accumulate.h"
#include "compression/second_moment.h"
#include "compression/select.h"
#include "compression/simd.h"

namespace compcoll {
namespace {

// The sample aims this much above k so that the candidates almost always
// contain the exact top-k (sampling error at 1 % is ~6 % of k), which the
// trim then extracts.
constexpr double kCandidateHeadroom = 1.2;

// One pass over [b, e): momentum correction and accumulation into v, and
// candidate collection against t. Two vectors per block keep the arithmetic
// in SIMD; the rare block holding a candidate is rescanned element by
// element. parts (nparts of them, indexed from off) are added to g first,
// in order: the host sum of Addends.
template <MomentumMode M>
size_t update_range(const float* g, const float* const* parts, size_t nparts, size_t off,
                    float scale, float m, float* u, float* v, size_t b, size_t e, float t,
                    std::vector<uint32_t>& cand, size_t cap) {
  using simd::f32x4;
  using simd::i32x4;
  constexpr size_t kBlock = 16;
  const f32x4 sc = simd::splat(scale), mv = simd::splat(m), tv = simd::splat(t);
  size_t count = 0;
  auto collect = [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      if (passes<SelectKey::kMagnitude>(v[i], t)) {
        if (cand.size() < cap) cand.push_back(static_cast<uint32_t>(i));
        ++count;
      }
    }
  };
  size_t i0 = b;
  for (; i0 + kBlock <= e; i0 += kBlock) {
    i32x4 hit = {};
    for (size_t i = i0; i < i0 + kBlock; i += simd::kLanes) {
      f32x4 gi = simd::load(g + i);
      for (size_t l = 0; l < nparts; ++l) gi = gi + simd::load(parts[l] + (i - off));
      const f32x4 x = simd::load(v + i) + momentum_step4<M>(gi * sc, u, i, mv);
      simd::store(v + i, x);
      hit |= passes4<SelectKey::kMagnitude>(x, tv);  // NaN passes
    }
    if (simd::any(hit)) collect(i0, i0 + kBlock);
  }
  float dummy_u = 0.0f;
  for (size_t i = i0; i < e; ++i) {
    float gi = g[i];
    for (size_t l = 0; l < nparts; ++l) gi += parts[l][i - off];
    float& ui = M == MomentumMode::kNone ? dummy_u : u[i];
    v[i] += momentum_step<M>(gi * scale, ui, m);
  }
  collect(i0, e);
  return count;
}

// update_range over [b, e): the part inside the addends' range with them,
// the rest without, in index order (so candidates stay sorted).
template <MomentumMode M>
size_t fused_update_range(const float* g, const Addends& add, float scale, float m, float* u,
                          float* v, size_t b, size_t e, float t, std::vector<uint32_t>& cand,
                          size_t cap) {
  const size_t a0 = std::clamp(add.empty() ? e : add.off, b, e);
  const size_t a1 = std::clamp(add.empty() ? e : add.off + add.len, a0, e);
  size_t count = update_range<M>(g, nullptr, 0, 0, scale, m, u, v, b, a0, t, cand, cap);
  count += update_range<M>(g, add.parts.data(), add.parts.size(), add.off, scale, m, u, v, a0, a1,
                           t, cand, cap);
  return count + update_range<M>(g, nullptr, 0, 0, scale, m, u, v, a1, e, t, cand, cap);
}

// fused_update_range over the whole tensor on up to `threads` threads, each
// over a contiguous range (bounds at multiples of 16, update_range's block).
// Each range keeps up to cap candidates of its own; joined in range order and
// cut to cap, they are exactly the first cap of one pass, and the counts add
// up: the same bits as one thread.
template <MomentumMode M>
size_t fused_update(const float* g, const Addends& add, float scale, float m, float* u, float* v,
                    size_t n, float t, std::vector<uint32_t>& cand, size_t cap, int threads) {
  const size_t ranges =
      std::min<size_t>(std::max(threads, 1), std::max<size_t>(1, n / kDgcElemsPerThread));
  if (ranges <= 1) return fused_update_range<M>(g, add, scale, m, u, v, 0, n, t, cand, cap);
  const size_t step = (n / ranges + 15) / 16 * 16;
  std::vector<std::vector<uint32_t>> found(ranges);
  std::vector<size_t> counts(ranges, 0);
  std::vector<std::exception_ptr> failed(ranges);
  auto run = [&](size_t r) {
    try {
      const size_t b = std::min(n, r * step);
      const size_t e = r + 1 == ranges ? n : std::min(n, b + step);
      counts[r] = fused_update_range<M>(g, add, scale, m, u, v, b, e, t, found[r], cap);
    } catch (...) {
      failed[r] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(ranges - 1);
  for (size_t r = 1; r < ranges; ++r) helpers.emplace_back(run, r);
  run(0);
  for (std::thread& h : helpers) h.join();
  for (const std::exception_ptr& f : failed) {
    if (f) std::rethrow_exception(f);
  }
  size_t count = 0;
  for (size_t r = 0; r < ranges; ++r) {
    count += counts[r];
    const size_t room = cap > cand.size() ? cap - cand.size() : 0;
    cand.insert(cand.end(), found[r].begin(),
                found[r].begin() + static_cast<std::ptrdiff_t>(std::min(room, found[r].size())));
  }
  return count;
}

}  // namespace

const char* warmup_shape_name(WarmupShape s) { return s == WarmupShape::kSmooth ? "smooth" : "stages"; }

double warmup_density(double density, int warmup_steps, uint64_t step, WarmupShape shape) {
  if (warmup_steps <= 0 || step >= static_cast<uint64_t>(warmup_steps) || density >= 0.25) {
    return density;
  }
  // Stages j = 1..S with 0.25^j > density, spread evenly over the warm-up.
  int stages = 0;
  for (double kept = 0.25; kept > density && stages < 64; kept *= 0.25) ++stages;
  if (shape == WarmupShape::kSmooth) {
    // Each 4x drop of the stages leaves a compressed run behind dense for a
    // while; falling a little at every step takes the first drop (25% to
    // 6.25%) apart, which is what a short job's loss sees (docs/convergence.md,
    // "The warm-up's shape").
    const double exponent = 0.5 + static_cast<double>(step) * stages / warmup_steps;
    return std::max(density, std::min(0.25, std::pow(0.25, exponent)));
  }
  const int stage = 1 + static_cast<int>(step * stages / static_cast<uint64_t>(warmup_steps));
  return std::max(density, std::pow(0.25, stage));
}

void validate_sparsify_config(const SparsifyConfig& c, const char* codec) {
  CC_CHECK(c.density > 0.0 && c.density <= 1.0, kInvalidArgument, codec, ": density ", c.density,
           " is outside (0, 1]");
  CC_CHECK(c.momentum >= 0.0f && c.momentum < 1.0f, kInvalidArgument, codec, ": momentum ",
           c.momentum, " is outside [0, 1)");
  CC_CHECK(c.clip >= 0.0f && std::isfinite(c.clip), kInvalidArgument, codec, ": clip ", c.clip,
           " must be a finite value >= 0 (0 disables clipping)");
  CC_CHECK(c.world_size >= 1, kInvalidArgument, codec, ": world size ", c.world_size,
           " must be >= 1");
  CC_CHECK(c.mask_density >= 0.0 && c.mask_density <= 1.0, kInvalidArgument, codec,
           ": momentum masking density ", c.mask_density, " is outside [0, 1]");
  CC_CHECK(c.second_moment_beta >= 0.0f && c.second_moment_beta < 1.0f, kInvalidArgument, codec,
           ": second-moment beta ", c.second_moment_beta, " is outside [0, 1) (0: magnitude selection)");
  CC_CHECK(c.warmup_steps >= 0, kInvalidArgument, codec, ": warm-up steps ", c.warmup_steps,
           " must be >= 0");
}

DgcCodec::DgcCodec(const DgcConfig& config) : config_(config) {
  validate_sparsify_config(config, "dgc");
  CC_CHECK(config.sample_fraction > 0.0 && config.sample_fraction <= 1.0, kInvalidArgument,
           "dgc: sample fraction ", config.sample_fraction, " is outside (0, 1]");
  CC_CHECK(config.threads >= 1, kInvalidArgument, "dgc: ", config.threads, " threads");
}

std::unique_ptr<CodecState> make_sparsify_state(const SparsifyConfig& c, size_t n) {
  auto st = std::make_unique<CodecState>(n);
  if (c.momentum > 0.0f) st->u.assign(n, 0.0f);
  return st;
}

std::unique_ptr<CodecState> DgcCodec::make_state(size_t n) const {
  return make_sparsify_state(config_, n);
}

EncodeInfo DgcCodec::encode(const float* grad, size_t n, CodecState& st, Bytes& payload) const {
  return encode_sum(grad, Addends{}, n, st, payload);
}

bool DgcCodec::fuses_addends() const {
  // Clipping needs the sum's norm before the pass, and normalized selection
  // accumulates in a pass of its own: both take the sum from grad.
  return config_.clip == 0.0f && config_.second_moment_beta == 0.0f;
}

EncodeInfo DgcCodec::encode_sum(const float* grad, const Addends& add, size_t n, CodecState& st,
                                Bytes& payload) const {
  CC_CHECK_EQ(st.size(), n, kInvalidArgument, "dgc: state was made for another tensor size");
  CC_CHECK(add.empty() || (fuses_addends() && add.off + add.len <= n), kInternal,
           "dgc: addends for [", add.off, ", ", add.off + add.len, ") of ", n,
           " elements, or with clipping or normalized selection");
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps, config_.warmup_shape);
  info.wanted = target_count(info.density, n);
  const MomentumMode mode = momentum_mode(config_.momentum, config_.nesterov);
  const float m = config_.momentum;
  const float scale = clip_scale(grad, n, config_.clip, config_.world_size);
  float* u = st.u.data();
  float* v = st.v.data();
  const SamplePlan plan = SamplePlan::make(n, config_.sample_fraction, st.steps);
  const double pass_fraction =
      n ? std::min(1.0, kCandidateHeadroom * double(info.wanted) / double(n)) : 1.0;
  std::vector<float> sample;
  sample.reserve(n / plan.stride + 1);
  std::vector<uint32_t> cand;
  const size_t cap = candidate_cap(info.wanted);
  cand.reserve(std::min(cap, n));
  float t = 0.0f;
  size_t count = 0;
  // The array the selection ranks: v, or its normalized view.
  const float* keys = v;
  std::unique_ptr<float[]> view;
  if (config_.second_moment_beta > 0.0f) {
    // Accumulate first (the view needs this step's s), then sample and scan
    // the view: two passes where the magnitude path fuses them.
    view = accumulate_normalized(mode, grad, scale, m, st, config_.second_moment_beta, n);
    keys = view.get();
    for (size_t i = plan.offset; i < n; i += plan.stride) {
      sample.push_back(select_key<SelectKey::kMagnitude>(keys[i]));
    }
    t = sample_threshold(sample, pass_fraction);
    count = scan_candidates(keys, n, t, SelectKey::kMagnitude, cand, cap);
  } else {
    // Threshold from a strided sample of what |v| will be after this step.
    dispatch_momentum(mode, [&](auto mc) {
      constexpr MomentumMode M = decltype(mc)::value;
      for (size_t i = plan.offset; i < n; i += plan.stride) {
        const float ui = M == MomentumMode::kNone ? 0.0f : u[i];
        sample.push_back(select_key<SelectKey::kMagnitude>(
            v[i] + momentum_peek<M>(add.sum_at(grad, i) * scale, ui, m)));
      }
      return 0;
    });
    t = sample_threshold(sample, pass_fraction);
    count = dispatch_momentum(mode, [&](auto mc) {
      return fused_update<decltype(mc)::value>(grad, add, scale, m, u, v, n, t, cand, cap,
                                               config_.threads);
    });
  }

  const SelectionTarget target{info.wanted, (info.wanted * 4 + 4) / 5, info.wanted};
  info.threshold = finalize_selection(keys, n, target, SelectKey::kMagnitude, sample,
                                      pass_fraction, t, count, cand);
  info.sent = cand.size();
  emit_sparse(cand, st, n, config_.encoding, info.density <= config_.mask_density, payload);
  ++st.steps;
  return info;
}

void emit_sparse(const std::vector<uint32_t>& selected, CodecState& st, uint64_t n,
                 SparseEncoding encoding, bool masking, Bytes& payload) {
  std::vector<float> values(selected.size());
  float* v = st.v.data();
  for (size_t i = 0; i < selected.size(); ++i) values[i] = v[selected[i]];
  encode_sparse(selected, values, n, encoding, payload);
  // values now hold what receivers decode. Keep the rounding error (fp16,
  // bf16) in the residual; a non-finite value was sent as is and must not
  // poison the residual, so its slot restarts from zero, and so does its
  // velocity, masked or not: u = m*u + g kept the value and v += u would
  // bring it back at every later call.
  const bool velocity = !st.u.empty();
  for (size_t i = 0; i < selected.size(); ++i) {
    float& vi = v[selected[i]];
    const bool finite = std::isfinite(values[i]) && std::isfinite(vi);
    vi = finite ? vi - values[i] : 0.0f;
    if (!finite && velocity) st.u[selected[i]] = 0.0f;
  }
  if (masking && velocity) {
    for (const uint32_t idx : selected) st.u[idx] = 0.0f;  // momentum factor masking
  }
}

}  // namespace compcoll
