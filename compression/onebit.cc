#include "compression/onebit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>


#include "compcoll/error.h"
#include "compression/non_finite.h"
#include "compression/payload.h"
#include "compression/simd.h"

namespace compcoll {
namespace {

constexpr int kMaxLog2Block = 24;

size_t scales_per_block(ScaleMode m) { return m == ScaleMode::kSignedMeans ? 2 : 1; }

struct BlockScales {
  float pos;  // reconstruction of a 0 bit
  float neg;  // magnitude of the reconstruction of a 1 bit
};

// Pass A over one block (which then sits in L1): e = x + err, left in err,
// and the sums the scales need. A "negative" element is one whose sign bit
// is set, exactly what the sign bit on the wire will say. Non-finite
// elements are moved to `odd` (sent exactly, see non_finite.h), replaced by
// +0 in the block and left out of the scales.
template <ScaleMode mode>
BlockScales accumulate_block(const float* x, float* err, size_t len, size_t base,
                             std::vector<NonFinite>& odd) {
  using simd::f32x4;
  using simd::i32x4;
  const f32x4 max = simd::splat(std::numeric_limits<float>::max());
  f32x4 abs_sum = {}, neg_sum = {};
  i32x4 neg_cnt = {}, bad = {};
  size_t i = 0;
  for (; i + simd::kLanes <= len; i += simd::kLanes) {
    const f32x4 e = simd::load(x + i) + simd::load(err + i);
    simd::store(err + i, e);
    const f32x4 a = simd::abs(e);
    bad |= ~(a <= max);
    abs_sum += a;
    if constexpr (mode == ScaleMode::kSignedMeans) {  // the pair needs the negative side too
      const i32x4 neg = simd::sign_mask(e);
      neg_sum += (f32x4)((i32x4)a & neg);
      neg_cnt -= neg;  // mask lanes are -1
    }
  }
  double abs_total = simd::sum(abs_sum), neg_total = simd::sum(neg_sum);
  double negatives = 0.0;
  for (size_t j = 0; j < simd::kLanes; ++j) negatives += neg_cnt[j];
  for (; i < len; ++i) {
    const float e = x[i] + err[i];
    err[i] = e;
    bad[0] |= !std::isfinite(e);
    abs_total += std::fabs(e);
    if (std::signbit(e)) {
      neg_total -= e;
      negatives += 1.0;
    }
  }
  // The float lanes overflow to Inf for huge finite inputs (2048 x 1e36):
  // the double sums below cannot, so take that path then too.
  if (!std::isfinite(abs_total) || !std::isfinite(neg_total)) bad[0] = -1;
  size_t finite = len;
  if (simd::any(bad)) {
    // Rare: redo the sums over the finite elements only.
    abs_total = neg_total = negatives = 0.0;
    for (size_t j = 0; j < len; ++j) {
      if (!std::isfinite(err[j])) {
        odd.push_back({static_cast<uint32_t>(base + j), err[j]});
        err[j] = 0.0f;
        --finite;
        continue;
      }
      abs_total += std::fabs(err[j]);
      if (std::signbit(err[j])) {
        neg_total -= err[j];
        negatives += 1.0;
      }
    }
  }
  if (mode == ScaleMode::kMeanMagnitude) {
    const float s = finite ? static_cast<float>(abs_total / double(finite)) : 0.0f;
    return {s, s};
  }
  const double positives = double(finite) - negatives;
  const double pos_total = abs_total - neg_total;
  return {positives > 0 ? static_cast<float>(pos_total / positives) : 0.0f,
          negatives > 0 ? static_cast<float>(neg_total / negatives) : 0.0f};
}

// |r| <= bound (bound > 0; bound = +Inf leaves r as it is).
simd::f32x4 clamp(simd::f32x4 r, simd::f32x4 bound) {
  r = simd::select(r > bound, bound, r);
  return simd::select(r < -bound, -bound, r);
}

// Pass B: the block's sign bits, and err = e - D(Q(e)), clamped to +-bound
// (onebit.h: the bounded residual; +Inf when unbounded).
void quantize_block(float* err, size_t len, BlockScales s, float bound, uint8_t* bits) {
  using simd::f32x4;
  const f32x4 pos = simd::splat(s.pos), neg = simd::splat(-s.neg), lim = simd::splat(bound);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const f32x4 e0 = simd::load(err + i), e1 = simd::load(err + i + 4);
    const simd::i32x4 m0 = simd::sign_mask(e0), m1 = simd::sign_mask(e1);
    bits[i / 8] = static_cast<uint8_t>(simd::bits(m0) | (simd::bits(m1) << 4));
    simd::store(err + i, clamp(e0 - simd::select(m0, neg, pos), lim));
    simd::store(err + i + 4, clamp(e1 - simd::select(m1, neg, pos), lim));
  }
  if (i < len) {
    uint8_t b = 0;
    for (size_t j = 0; i + j < len; ++j) {
      const bool negative = std::signbit(err[i + j]);
      b |= static_cast<uint8_t>(negative) << j;
      err[i + j] = std::clamp(err[i + j] - (negative ? -s.neg : s.pos), -bound, bound);
    }
    bits[i / 8] = b;
  }
}

// The residual bound of a block with these scales (+Inf: unbounded).
float residual_limit(const OneBitConfig& c, BlockScales s) {
  if (c.residual_bound == 0.0f) return std::numeric_limits<float>::infinity();
  return c.residual_bound * std::max(s.pos, s.neg);
}

}  // namespace

void validate_onebit_config(const OneBitConfig& c) {
  CC_CHECK(c.block >= 8 && std::has_single_bit(c.block) &&
               c.block <= (size_t{1} << kMaxLog2Block),
           kInvalidArgument, "onebit: block size ", c.block,
           " must be a power of two in [8, 2^24]");
  CC_CHECK(c.scale == ScaleMode::kMeanMagnitude || c.scale == ScaleMode::kSignedMeans,
           kInvalidArgument, "onebit: unknown scale mode ", int(c.scale));
  CC_CHECK(c.residual_bound >= 0.0f && std::isfinite(c.residual_bound), kInvalidArgument,
           "onebit: residual bound ", c.residual_bound, " must be a finite value >= 0 (0: unbounded)");
}

size_t onebit_payload_bytes(size_t n, const OneBitConfig& c) {
  const size_t blocks = (n + c.block - 1) / c.block;
  return kPayloadHeaderBytes + blocks * scales_per_block(c.scale) * sizeof(float) + (n + 7) / 8 +
         non_finite_bytes(0);
}

void onebit_encode(const OneBitConfig& c, const float* x, float* err, size_t n, Bytes& out) {
  validate_onebit_config(c);
  const size_t blocks = (n + c.block - 1) / c.block;
  const size_t per = scales_per_block(c.scale);
  out.resize(onebit_payload_bytes(n, c) - non_finite_bytes(0));  // the list comes last
  write_header({PayloadFormat::kOneBit, static_cast<uint8_t>(c.scale),
                static_cast<uint8_t>(std::countr_zero(c.block)), n, blocks},
               out.data());
  uint8_t* scales = out.data() + kPayloadHeaderBytes;
  uint8_t* bits = scales + blocks * per * sizeof(float);
  std::vector<NonFinite> odd;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * c.block;
    const size_t len = std::min(c.block, n - begin);
    const size_t odd_before = odd.size();
    const BlockScales s =
        c.scale == ScaleMode::kSignedMeans
            ? accumulate_block<ScaleMode::kSignedMeans>(x + begin, err + begin, len, begin, odd)
            : accumulate_block<ScaleMode::kMeanMagnitude>(x + begin, err + begin, len, begin, odd);
    store_le<float>(scales + b * per * 4, s.pos);
    if (per == 2) store_le<float>(scales + b * per * 4 + 4, s.neg);
    quantize_block(err + begin, len, s, residual_limit(c, s), bits + begin / 8);
    // Sent exactly: the error memory restarts from zero there.
    for (size_t j = odd_before; j < odd.size(); ++j) err[odd[j].idx] = 0.0f;
  }
  append_non_finite(out, odd);
}

void onebit_decode(std::span<const uint8_t> payload, float* out, size_t n, bool accumulate) {
  const PayloadHeader h = read_header(payload, PayloadFormat::kOneBit, n);
  CC_PAYLOAD_CHECK(h.aux0 <= static_cast<uint8_t>(ScaleMode::kSignedMeans),
                   "onebit: unknown scale mode ", int(h.aux0));
  CC_PAYLOAD_CHECK(h.aux1 >= 3 && h.aux1 <= kMaxLog2Block, "onebit: log2 block size ",
                   int(h.aux1), " outside [3, ", kMaxLog2Block, "]");
  const OneBitConfig c{size_t{1} << h.aux1, static_cast<ScaleMode>(h.aux0)};
  const size_t blocks = (n + c.block - 1) / c.block;
  CC_PAYLOAD_CHECK(h.k == blocks, "onebit: payload has ", h.k, " blocks, ", n, " elements in blocks of ",
                   c.block, " need ", blocks);
  const size_t fixed = onebit_payload_bytes(n, c) - non_finite_bytes(0);
  CC_PAYLOAD_CHECK(payload.size() >= fixed, "onebit: payload is ", payload.size(),
                   " bytes, at least ", fixed + non_finite_bytes(0), " expected");
  std::vector<NonFinite> odd;
  const size_t end = parse_non_finite(payload, fixed, n, odd);
  CC_PAYLOAD_CHECK(end == payload.size(), "onebit: ", payload.size() - end,
                   " trailing bytes after the payload");
  const size_t per = scales_per_block(c.scale);
  const uint8_t* scales = payload.data() + kPayloadHeaderBytes;
  const uint8_t* bits = scales + blocks * per * sizeof(float);
  // The encoder never sends a non-finite scale (NaN and Inf travel in the
  // non-finite list); one would spread over a whole block, and turn the
  // non-finite entries below into NaN in accumulate mode.
  for (size_t i = 0; i < blocks * per; ++i) {
    const float s = load_le<float>(scales + i * 4);
    CC_PAYLOAD_CHECK(std::isfinite(s), "onebit: scale ", i, " is not finite (", s, ")");
  }
  for (size_t b = 0; b < blocks; ++b) {
    const float pos = load_le<float>(scales + b * per * 4);
    const float neg = per == 2 ? -load_le<float>(scales + b * per * 4 + 4) : -pos;
    const simd::f32x4 posv = simd::splat(pos), negv = simd::splat(neg);
    const size_t begin = b * c.block;
    const size_t end = std::min(n, begin + c.block);
    size_t i = begin;
    for (; i + simd::kLanes <= end; i += simd::kLanes) {
      const uint32_t nibble = (bits[i / 8] >> (i % 8)) & 0xfu;  // i is a multiple of 4
      const simd::f32x4 val = simd::select(simd::expand_bits(nibble), negv, posv);
      simd::store(out + i, accumulate ? simd::load(out + i) + val : val);
    }
    for (; i < end; ++i) {
      const float val = (bits[i / 8] >> (i % 8)) & 1u ? neg : pos;
      out[i] = accumulate ? out[i] + val : val;
    }
  }
  // Non-finite values land exactly where a dense sum puts them (what the
  // block's scale added there cannot change a NaN or an Inf).
  for (const NonFinite& e : odd) out[e.idx] = accumulate ? out[e.idx] + e.value : e.value;
}

}  // namespace compcoll
