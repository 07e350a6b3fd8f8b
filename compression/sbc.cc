#include "compression/sbc.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compcoll/error.h"
#include "compression/dgc.h"  // warmup_density
#include "compression/golomb.h"
#include "compression/non_finite.h"
#include "compression/payload.h"
#include "compression/select.h"
#include "compression/simd.h"

namespace compcoll {
namespace {

constexpr double kCandidateHeadroom = 1.2;  // as dgc: sample aims above k

struct SideCandidates {
  std::vector<uint32_t> idx;
  size_t count = 0;
};

// One pass: v += g, collecting entries >= t_pos, entries <= -t_neg, and
// non-finite entries (which travel apart, see non_finite.h).
void fused_accumulate(const float* g, float* v, size_t n, float t_pos, float t_neg,
                      SideCandidates& pos, SideCandidates& neg, std::vector<NonFinite>& odd,
                      size_t cap) {
  constexpr size_t kBlock = 16;
  auto collect = [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      if (!std::isfinite(v[i])) {
        odd.push_back({static_cast<uint32_t>(i), v[i]});
      } else if (v[i] >= t_pos) {
        if (pos.idx.size() < cap) pos.idx.push_back(static_cast<uint32_t>(i));
        ++pos.count;
      } else if (-v[i] >= t_neg) {
        if (neg.idx.size() < cap) neg.idx.push_back(static_cast<uint32_t>(i));
        ++neg.count;
      }
    }
  };
  using simd::f32x4;
  using simd::i32x4;
  const f32x4 tp = simd::splat(t_pos), tn = simd::splat(-t_neg);
  const f32x4 max = simd::splat(std::numeric_limits<float>::max());
  size_t i0 = 0;
  for (; i0 + kBlock <= n; i0 += kBlock) {
    i32x4 hit = {};
    for (size_t i = i0; i < i0 + kBlock; i += simd::kLanes) {
      const f32x4 x = simd::load(v + i) + simd::load(g + i);
      simd::store(v + i, x);
      hit |= (x >= tp) | (x <= tn) | ~(simd::abs(x) <= max);  // the last: NaN, Inf
    }
    if (simd::any(hit)) collect(i0, i0 + kBlock);
  }
  for (size_t i = i0; i < n; ++i) v[i] += g[i];
  collect(i0, n);
}

struct ParsedSbc {
  PayloadHeader h;
  float mean;
  std::vector<NonFinite> odd;
  std::span<const uint8_t> bits;
};

ParsedSbc parse_sbc(std::span<const uint8_t> payload, uint64_t n) {
  ParsedSbc p;
  p.h = read_header(payload, PayloadFormat::kSbc, n);
  CC_PAYLOAD_CHECK(p.h.aux1 <= 1, "sbc side flag ", int(p.h.aux1), " is neither 0 nor 1");
  CC_PAYLOAD_CHECK(payload.size() >= kPayloadHeaderBytes + 4, "sbc payload of ", payload.size(),
                   " bytes is missing its mean");
  p.mean = load_le<float>(payload.data() + kPayloadHeaderBytes);
  CC_PAYLOAD_CHECK(std::isfinite(p.mean), "sbc mean is not finite");
  const size_t bits_at = parse_non_finite(payload, kPayloadHeaderBytes + 4, n, p.odd);
  p.bits = payload.subspan(bits_at);
  return p;
}

}  // namespace

DgcConfig sbc_warmup_config(const SbcConfig& config) {
  DgcConfig d;
  d.density = config.density;
  d.momentum = config.momentum;
  d.nesterov = config.nesterov;
  d.mask_density = config.mask_density;
  d.warmup_steps = config.warmup_steps;
  d.sample_fraction = config.sample_fraction;
  return d;
}

void sbc_adopt_dgc_velocity(const SbcConfig& config, float* u, size_t n) {
  if (!config.nesterov || config.momentum <= 0.0f) return;
  const float inv = 1.0f / config.momentum;
  for (size_t i = 0; i < n; ++i) u[i] *= inv;
}

SbcCodec::SbcCodec(const SbcConfig& config) : config_(config) {
  CC_CHECK(config.density > 0.0 && config.density <= 1.0, kInvalidArgument, "sbc: density ",
           config.density, " is outside (0, 1]");
  CC_CHECK(config.sample_fraction > 0.0 && config.sample_fraction <= 1.0, kInvalidArgument,
           "sbc: sample fraction ", config.sample_fraction, " is outside (0, 1]");
  CC_CHECK(config.warmup_steps >= 0, kInvalidArgument, "sbc: warm-up steps ", config.warmup_steps,
           " must be >= 0");
  CC_CHECK(config.momentum >= 0.0f && config.momentum < 1.0f, kInvalidArgument, "sbc: momentum ",
           config.momentum, " is outside [0, 1)");
  if (config.exact_warmup && config.warmup_steps > 0) {
    warmup_ = std::make_unique<DgcCodec>(sbc_warmup_config(config));
  }
}

std::unique_ptr<CodecState> SbcCodec::make_state(size_t n) const {
  auto st = std::make_unique<CodecState>(n);
  if (config_.momentum > 0.0f) st->u.assign(n, 0.0f);
  return st;
}

EncodeInfo SbcCodec::encode(const float* grad, size_t n, CodecState& st, Bytes& payload) const {
  CC_CHECK_EQ(st.size(), n, kInvalidArgument, "sbc: state was made for another tensor size");
  if (warmup_ && st.steps < static_cast<uint64_t>(config_.warmup_steps)) {
    const EncodeInfo info = warmup_->encode(grad, n, st, payload);  // counts the step
    if (st.steps == static_cast<uint64_t>(config_.warmup_steps) && !st.u.empty()) {
      sbc_adopt_dgc_velocity(config_, st.u.data(), n);
    }
    return info;
  }
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps);
  info.wanted = target_count(info.density, n);
  float* v = st.v.data();

  // The momentum correction turns the gradient into what v accumulates: u
  // itself (updated in place, no copy), or g + m*u for Nesterov.
  std::vector<float> nesterov_step;
  if (config_.momentum > 0.0f) {
    CC_CHECK_EQ(st.u.size(), n, kInvalidArgument, "sbc: state has no momentum for this tensor");
    const float m = config_.momentum;
    float* u = st.u.data();
    for (size_t i = 0; i < n; ++i) u[i] = m * u[i] + grad[i];
    if (config_.nesterov) {
      nesterov_step.resize(n);
      for (size_t i = 0; i < n; ++i) nesterov_step[i] = grad[i] + m * u[i];
      grad = nesterov_step.data();
    } else {
      grad = u;
    }
  }

  // Both sides' thresholds from one strided sample of v + g.
  const SamplePlan plan = SamplePlan::make(n, config_.sample_fraction, st.steps);
  std::vector<float> sample_pos, sample_neg;
  sample_pos.reserve(n / plan.stride + 1);
  sample_neg.reserve(n / plan.stride + 1);
  for (size_t i = plan.offset; i < n; i += plan.stride) {
    float x = v[i] + grad[i];
    if (!std::isfinite(x)) x = 0.0f;  // sent apart; must not set a threshold
    sample_pos.push_back(x);
    sample_neg.push_back(-x);
  }
  const double pass_fraction =
      n ? std::min(1.0, kCandidateHeadroom * double(info.wanted) / double(n)) : 1.0;
  float t_pos = sample_threshold(sample_pos, pass_fraction);
  float t_neg = sample_threshold(sample_neg, pass_fraction);

  const size_t cap = candidate_cap(info.wanted);
  SideCandidates pos, neg;
  std::vector<NonFinite> odd;
  fused_accumulate(grad, v, n, t_pos, t_neg, pos, neg, odd, cap);
  for (const NonFinite& e : odd) v[e.idx] = 0.0f;  // sent exactly; the residual restarts
  const SelectionTarget target{info.wanted, (info.wanted * 4 + 4) / 5, info.wanted};
  t_pos = finalize_selection(v, n, target, SelectKey::kPositive, sample_pos, pass_fraction, t_pos,
                             pos.count, pos.idx);
  t_neg = finalize_selection(v, n, target, SelectKey::kNegative, sample_neg, pass_fraction, t_neg,
                             neg.count, neg.idx);

  auto mean_of = [&](const std::vector<uint32_t>& idx) {
    double s = 0.0;
    for (uint32_t i : idx) s += v[i];
    return idx.empty() ? 0.0 : s / double(idx.size());
  };
  const double mean_pos = mean_of(pos.idx);
  const double mean_neg = mean_of(neg.idx);
  const bool negative = std::fabs(mean_neg) > std::fabs(mean_pos);
  const std::vector<uint32_t>& sent = negative ? neg.idx : pos.idx;
  const float mean = static_cast<float>(negative ? mean_neg : mean_pos);

  const int b = golomb_rice_parameter(n ? double(sent.size()) / double(n) : 1.0);
  payload.resize(kPayloadHeaderBytes + 4);
  write_header({PayloadFormat::kSbc, static_cast<uint8_t>(b), static_cast<uint8_t>(negative), n,
                sent.size()},
               payload.data());
  store_le<float>(payload.data() + kPayloadHeaderBytes, mean);
  append_non_finite(payload, odd);
  rice_encode_positions(sent, b, payload);

  for (uint32_t i : sent) v[i] -= mean;
  if (config_.momentum > 0.0f && info.density <= config_.mask_density) {
    for (uint32_t i : sent) st.u[i] = 0.0f;  // momentum factor masking
  }
  info.sent = sent.size();
  info.threshold = negative ? -t_neg : t_pos;
  ++st.steps;
  return info;
}

SbcEntries decode_sbc(std::span<const uint8_t> payload, uint64_t n) {
  const ParsedSbc p = parse_sbc(payload, n);
  SbcEntries e;
  e.idx = rice_decode_positions(p.bits, p.h.k, p.h.aux0, n);
  e.mean = p.mean;
  e.non_finite = std::move(p.odd);
  return e;
}

void decode_sbc_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n) {
  const SbcEntries e = decode_sbc(payload, n);
  for (uint32_t i : e.idx) out[i] += e.mean;
  for (const NonFinite& x : e.non_finite) out[x.idx] += x.value;
}

}  // namespace compcoll
