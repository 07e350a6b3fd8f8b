#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/payload.h"
#include "compression/sbc.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

// One step of a fresh codec on a Gaussian gradient: its payload.
Bytes first_payload(const SbcConfig& c, size_t n, uint64_t seed) {
  SbcCodec codec(c);
  auto st = codec.make_state(n);
  const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, seed);
  Bytes payload;
  codec.encode(g.data(), n, *st, payload);
  return payload;
}

TEST(Sbc, KeepsTheSideWithTheLargerMeanMagnitude) {
  const size_t n = 100000;
  SbcCodec codec(SbcConfig{0.01, 0.01});
  for (float sign : {1.0f, -1.0f}) {
    auto st = codec.make_state(n);
    auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 2);
    for (size_t i = 0; i < n; i += 50) g[i] = sign * 10.0f;  // a heavy side
    Bytes payload;
    codec.encode(g.data(), n, *st, payload);
    const SbcEntries e = decode_sbc(payload, n);
    EXPECT_EQ(e.idx.size(), 1000u);
    EXPECT_EQ(e.sides, sign > 0 ? kSbcPositiveSide : kSbcNegativeSide);
    EXPECT_GT(e.means[0] * sign, 5.0f);
    for (uint32_t i : e.idx) EXPECT_GT(g[i] * sign, 0.0f);
  }
}

// DGC's momentum correction in sbc: what v accumulates is the velocity u
// (u = m*u + g), nothing is lost (every velocity added so far = what was
// sent + the residual), and momentum factor masking restarts u at zero
// exactly where positions were sent.
class SbcSides : public ::testing::TestWithParam<bool> {};

TEST_P(SbcSides, MomentumCorrectionLosesNothingAndMasksTheSentPositions) {
  const size_t n = 50000;
  SbcConfig c{0.01, 0.01};
  c.momentum = 0.9f;
  c.both_sides = GetParam();
  SbcCodec codec(c);
  auto st = codec.make_state(n);
  ASSERT_EQ(st->u.size(), n);
  std::vector<double> fed(n, 0.0), sent(n, 0.0);
  std::vector<float> velocity(n, 0.0f);  // the reference u, masked as the codec masks it
  for (int step = 0; step < 12; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 40 + step);
    for (size_t i = 0; i < n; ++i) {
      velocity[i] = c.momentum * velocity[i] + g[i];
      fed[i] += velocity[i];
    }
    Bytes payload;
    codec.encode(g.data(), n, *st, payload);
    const SbcEntries e = decode_sbc(payload, n);
    ASSERT_FALSE(e.idx.empty());
    for (size_t j = 0; j < e.idx.size(); ++j) {
      const uint32_t i = e.idx[j];
      sent[i] += e.value(j);
      EXPECT_EQ(st->u[i], 0.0f) << "step " << step << " position " << i;
      velocity[i] = 0.0f;
    }
  }
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sent[i] + st->v[i] - fed[i]));
    scale = std::max(scale, std::fabs(fed[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale);
  // Without masking the velocity keeps running where values were sent.
  c.mask_density = 0.0;
  SbcCodec unmasked(c);
  auto su = unmasked.make_state(n);
  const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 40);
  Bytes payload;
  unmasked.encode(g.data(), n, *su, payload);
  for (uint32_t i : decode_sbc(payload, n).idx) EXPECT_EQ(su->u[i], g[i]);
}

INSTANTIATE_TEST_SUITE_P(OneOrBoth, SbcSides, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "BothSides" : "OneSide"; });

// COMPCOLL_SBC_SIDES=both: the top ceil(k/2) entries of each sign, each sign
// binarised to its own mean; what was not sent (and each entry's
// binarisation error) stays in the residual.
TEST(Sbc, BothSidesSendTheTopOfEachSignWithItsOwnMean) {
  const size_t n = 100000;
  SbcConfig c{0.01, 0.01};
  c.both_sides = true;
  SbcCodec codec(c);
  auto st = codec.make_state(n);
  auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 2);
  for (size_t i = 0; i < n; i += 50) g[i] = 10.0f;  // a heavy positive side
  Bytes payload;
  codec.encode(g.data(), n, *st, payload);
  const SbcEntries e = decode_sbc(payload, n);
  ASSERT_EQ(e.sides, kSbcBothSides);
  ASSERT_EQ(e.side.size(), e.idx.size());
  std::vector<bool> sent(n, false);
  double sum[2] = {0.0, 0.0};
  size_t count[2] = {0, 0};
  for (size_t j = 0; j < e.idx.size(); ++j) {
    const uint32_t i = e.idx[j];
    sent[i] = true;
    EXPECT_EQ(e.side[j], g[i] < 0.0f ? 1 : 0) << i;
    EXPECT_NE(g[i], 0.0f) << i;
    sum[e.side[j]] += g[i];
    ++count[e.side[j]];
    EXPECT_EQ(st->v[i], g[i] - e.value(j)) << i;
  }
  // Each side: 80-100 % of ceil(k/2) = 500, its own mean, and its top.
  for (int s : {0, 1}) {
    EXPECT_GE(count[s], 400u) << s;
    EXPECT_LE(count[s], 500u) << s;
    EXPECT_FLOAT_EQ(e.means[s], float(sum[s] / double(count[s]))) << s;
  }
  EXPECT_EQ(e.means[0], 10.0f);  // the 2000 heavy entries hold the top 500
  EXPECT_LT(e.means[1], -2.0f);
  float weakest_pos = 1e9f, weakest_neg = 1e9f, strongest_unsent = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (sent[i]) {
      (g[i] > 0 ? weakest_pos : weakest_neg) = std::min(g[i] > 0 ? weakest_pos : weakest_neg,
                                                        std::fabs(g[i]));
    } else {
      EXPECT_EQ(st->v[i], g[i]);
      if (g[i] < 0) strongest_unsent = std::max(strongest_unsent, -g[i]);
    }
  }
  EXPECT_GE(weakest_neg, strongest_unsent);
  std::vector<float> out(n, 0.0f);
  decode_sbc_accumulate(payload, out.data(), n);
  for (size_t j = 0; j < e.idx.size(); ++j) EXPECT_EQ(out[e.idx[j]], e.value(j));
}

// A side never sends entries of the other sign (or zeros) to fill its count
// (the selection's threshold never falls to zero, select.h):
// with no entry of the rare sign at all its side sends nothing, its mean
// travels as 0, and the positions still decode. Both ways round.
TEST(Sbc, BothSidesSendOnlyEntriesOfTheirOwnSign) {
  const size_t n = 20000;
  SbcConfig c{0.01, 0.01};
  c.both_sides = true;
  SbcCodec codec(c);
  for (float common : {1.0f, -1.0f}) {
    for (size_t rare : {size_t(0), size_t(7)}) {
      SCOPED_TRACE(std::to_string(common) + " " + std::to_string(rare));
      auto st = codec.make_state(n);
      std::vector<float> g(n, 0.0f);
      for (size_t i = 0; i < n; i += 3) g[i] = common * (1.0f + float(i % 17));
      for (size_t j = 0; j < rare; ++j) g[1 + 3 * j] = -common * 2.0f;
      Bytes payload;
      codec.encode(g.data(), n, *st, payload);
      const SbcEntries e = decode_sbc(payload, n);
      const uint8_t rare_side = common > 0 ? 1 : 0;
      size_t sent_rare = 0;
      for (size_t j = 0; j < e.idx.size(); ++j) {
        EXPECT_EQ(e.side[j] == 1, g[e.idx[j]] < 0.0f) << e.idx[j];
        EXPECT_NE(g[e.idx[j]], 0.0f) << e.idx[j];
        sent_rare += e.side[j] == rare_side;
      }
      EXPECT_EQ(sent_rare, rare);
      EXPECT_EQ(e.means[rare_side], rare ? -common * 2.0f : 0.0f);
      EXPECT_GE(e.idx.size() - sent_rare, 80u);  // the common side: 80-100 % of 100
    }
  }
}

// binarise_sides on its own (the codecs' selections never hold zeros or
// entries of the other sign, select.h; the function does not rely on it):
// both sides keep only their sign, so the merged positions stay distinct;
// one side sends the side with the larger mean magnitude whole.
TEST(Sbc, BinariseSidesKeepsEachSidesSignAndMergesInOrder) {
  const SbcSelection pos{{1, 3, 5, 9}, {2.0f, -1.0f, 0.0f, 4.0f}};
  const SbcSelection neg{{3, 4}, {-1.0f, -3.0f}};
  const SbcEntries both = binarise_sides(pos, neg, true);
  EXPECT_EQ(both.sides, kSbcBothSides);
  EXPECT_EQ(both.idx, (std::vector<uint32_t>{1, 3, 4, 9}));
  EXPECT_EQ(both.side, (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(both.means[0], 3.0f);
  EXPECT_EQ(both.means[1], -2.0f);
  const SbcEntries one = binarise_sides(pos, neg, false);  // means 1.25 and -2
  EXPECT_EQ(one.sides, kSbcNegativeSide);
  EXPECT_EQ(one.idx, neg.idx);
  EXPECT_EQ(one.side, (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(one.means[0], -2.0f);
  const SbcEntries none = binarise_sides({{2}, {-5.0f}}, {{7}, {1.0f}}, true);
  EXPECT_TRUE(none.idx.empty());
  EXPECT_EQ(none.means[0], 0.0f);
  EXPECT_EQ(none.means[1], 0.0f);
}

TEST(Sbc, BothSidesPayloadRejectsBadSignBitsAndStrayMeans) {
  const size_t n = 10000;
  SbcConfig c{0.001, 0.01};  // k = 10: 5 per side, 2 bytes of sign bits
  c.both_sides = true;
  const Bytes payload = first_payload(c, n, 4);
  const SbcEntries e = decode_sbc(payload, n);
  ASSERT_EQ(e.idx.size(), 10u);
  const size_t bits_at = kPayloadHeaderBytes + 8 + 4;  // header, two means, empty non-finite list
  ASSERT_EQ(payload[bits_at + 1] >> 2, 0);
  std::vector<float> out(n, 0.0f);
  Bytes bad = payload;
  bad[bits_at + 1] |= 0x80;  // a padding bit
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  bad = payload;
  bad[5] = 3;  // side flag
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  bad = payload;
  store_le<float>(bad.data() + kPayloadHeaderBytes + 4, std::numeric_limits<float>::infinity());
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  // Every position on the positive side: the negative mean must then be 0.
  bad = payload;
  bad[bits_at] = bad[bits_at + 1] = 0;
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  store_le<float>(bad.data() + kPayloadHeaderBytes + 4, 0.0f);
  decode_sbc_accumulate(bad, out.data(), n);
  for (uint32_t i : e.idx) EXPECT_EQ(out[i], e.means[0]);
  std::fill(out.begin(), out.end(), 0.0f);
  // Truncated inside the means and inside the sign bits.
  EXPECT_THROW(decode_sbc_accumulate({payload.data(), kPayloadHeaderBytes + 6}, out.data(), n),
               Error);
  EXPECT_THROW(decode_sbc_accumulate({payload.data(), bits_at + 1}, out.data(), n), Error);
  // k larger than the tensor.
  bad = payload;
  store_le<uint32_t>(bad.data() + 12, static_cast<uint32_t>(n + 1));
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  EXPECT_EQ(out, std::vector<float>(n, 0.0f));
}

// COMPCOLL_WARMUP_STEPS: sbc's density follows dgc's warm-up ramp (25 %,
// then x1/4 per stage) and reaches its target when the warm-up ends.
TEST(Sbc, WarmUpRampsTheDensityDownToItsTarget) {
  const size_t n = 100000;
  SbcConfig c{0.001, 0.01};
  c.warmup_steps = 8;
  SbcCodec codec(c);
  auto st = codec.make_state(n);
  Bytes payload;
  for (uint64_t step = 0; step < 10; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, step);
    const EncodeInfo info = codec.encode(g.data(), n, *st, payload);
    EXPECT_DOUBLE_EQ(info.density, warmup_density(0.001, 8, step, c.warmup_shape)) << step;
    const size_t sent = decode_sbc(payload, n).idx.size();  // one side: 80-100 % of k
    EXPECT_LE(sent, info.wanted) << step;
    EXPECT_GE(sent * 5, info.wanted * 4) << step;
  }
  for (const WarmupShape shape : {WarmupShape::kStages, WarmupShape::kSmooth}) {
    EXPECT_DOUBLE_EQ(warmup_density(0.001, 8, 0, shape), 0.25);
    EXPECT_DOUBLE_EQ(warmup_density(0.001, 8, 9, shape), 0.001);
  }
  // The shape reaches the codec (and its exact warm-up's dgc).
  c.warmup_shape = WarmupShape::kSmooth;
  EXPECT_EQ(sbc_warmup_config(c).warmup_shape, WarmupShape::kSmooth);
  SbcCodec smooth(c);
  auto sst = smooth.make_state(n);
  for (uint64_t step = 0; step < 10; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, step);
    EXPECT_DOUBLE_EQ(smooth.encode(g.data(), n, *sst, payload).density,
                     warmup_density(0.001, 8, step, WarmupShape::kSmooth)) << step;
  }
  c.warmup_steps = -1;
  EXPECT_THROW(SbcCodec{c}, Error);
}

// COMPCOLL_SBC_WARMUP=exact: over the warm-up sbc is dgc on the same state
// (the same payload bytes, residual and velocity as a DgcCodec of
// sbc_warmup_config given the same gradients), and binarises after it;
// nothing is lost across the switch.
TEST_P(SbcSides, ExactWarmUpIsDgcThenBinarises) {
  const size_t n = 60000;
  SbcConfig c{0.001, 0.01};
  c.both_sides = GetParam();
  c.warmup_steps = 6;
  c.momentum = 0.9f;
  c.mask_density = 0.02;
  c.exact_warmup = true;
  SbcCodec codec(c);
  DgcCodec dgc(sbc_warmup_config(c));
  auto st = codec.make_state(n);
  auto ref = dgc.make_state(n);
  std::vector<double> fed(n, 0.0), got(n, 0.0);
  std::vector<float> velocity(n, 0.0f);
  for (uint64_t step = 0; step < 10; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 70 + step);
    Bytes payload, expected;
    const EncodeInfo info = codec.encode(g.data(), n, *st, payload);
    EXPECT_DOUBLE_EQ(info.density, warmup_density(0.001, 6, step, c.warmup_shape)) << step;
    std::vector<float> out(n, 0.0f);
    decode_accumulate(payload, out.data(), n);
    if (step < 6) {
      dgc.encode(g.data(), n, *ref, expected);
      EXPECT_EQ(peek_format(payload), PayloadFormat::kSparse) << step;
      EXPECT_EQ(payload, expected) << "step " << step;
      EXPECT_EQ(st->v, ref->v) << "step " << step;
      EXPECT_EQ(st->u, ref->u) << "step " << step;
    } else {
      EXPECT_EQ(peek_format(payload), PayloadFormat::kSbc) << step;
    }
    // The reference velocity, masked where the codec's was (it restarts at 0).
    for (size_t i = 0; i < n; ++i) {
      velocity[i] = c.momentum * velocity[i] + g[i];
      fed[i] += velocity[i];
      got[i] += out[i];
      if (st->u[i] == 0.0f) velocity[i] = 0.0f;
    }
  }
  EXPECT_EQ(st->steps, 10u);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(got[i] + st->v[i] - fed[i]));
    scale = std::max(scale, std::fabs(fed[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale);
  // Binary (the paper's): sbc payloads from the first step.
  c.exact_warmup = false;
  SbcCodec binary(c);
  auto sb = binary.make_state(n);
  const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 70);
  Bytes payload;
  binary.encode(g.data(), n, *sb, payload);
  EXPECT_EQ(peek_format(payload), PayloadFormat::kSbc);
}

// The exact warm-up runs at its own entries and density (dgc's, from the
// registry) and sbc binarises at its own density from the first step after
// it; what the warm-up rounds (fp8 values) stays in the residual.
TEST(Sbc, ExactWarmUpRunsAtItsOwnEncodingAndDensityThenBinarisesAtSbcs) {
  const size_t n = 60000;
  SbcConfig c{0.001, 0.01};
  c.both_sides = true;
  c.warmup_steps = 6;
  c.exact_warmup = true;
  c.warmup_shape = WarmupShape::kSmooth;
  c.warmup_encoding = {ValueType::kFp8, IndexType::kRiceGap};
  c.warmup_density = 0.004;
  const DgcConfig d = sbc_warmup_config(c);
  EXPECT_DOUBLE_EQ(d.density, 0.004);
  EXPECT_EQ(d.encoding.values, ValueType::kFp8);
  EXPECT_EQ(d.encoding.indices, IndexType::kRiceGap);
  SbcCodec codec(c);
  DgcCodec dgc(d);
  auto st = codec.make_state(n);
  auto ref = dgc.make_state(n);
  std::vector<double> fed(n, 0.0), got(n, 0.0);
  for (uint64_t step = 0; step < 10; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 90 + step);
    Bytes payload, expected;
    const EncodeInfo info = codec.encode(g.data(), n, *st, payload);
    std::vector<float> out(n, 0.0f);
    decode_accumulate(payload, out.data(), n);
    if (step < 6) {
      EXPECT_DOUBLE_EQ(info.density, warmup_density(0.004, 6, step, c.warmup_shape)) << step;
      dgc.encode(g.data(), n, *ref, expected);
      EXPECT_EQ(payload, expected) << "step " << step;
      EXPECT_EQ(st->v, ref->v) << "step " << step;
    } else {
      EXPECT_DOUBLE_EQ(info.density, 0.001) << step;
      EXPECT_EQ(peek_format(payload), PayloadFormat::kSbc) << step;
    }
    for (size_t i = 0; i < n; ++i) {
      fed[i] += g[i];
      got[i] += out[i];
    }
  }
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(got[i] + st->v[i] - fed[i]));
    scale = std::max(scale, std::fabs(fed[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale);
  // Unset, the warm-up keeps sbc's density and fp32 values with u32 indices.
  const DgcConfig plain = sbc_warmup_config(SbcConfig{0.001, 0.01});
  EXPECT_DOUBLE_EQ(plain.density, 0.001);
  EXPECT_EQ(plain.encoding.values, ValueType::kFp32);
  EXPECT_EQ(plain.encoding.indices, IndexType::kU32);
}

// dgc keeps m times Nesterov's velocity in u, sbc the velocity itself: at
// the end of an exact warm-up the state is converted, so sbc's first binary
// step continues the same velocity.
TEST(Sbc, ExactWarmUpHandsNesterovVelocityOverInSbcsForm) {
  const size_t n = 30000;
  SbcConfig c{0.01, 0.01};
  c.warmup_steps = 3;
  c.momentum = 0.8f;
  c.nesterov = true;
  c.mask_density = 0.0;  // never mask: the velocity is the plain running sum
  c.exact_warmup = true;
  SbcCodec codec(c);
  auto st = codec.make_state(n);
  std::vector<double> velocity(n, 0.0);
  Bytes payload;
  for (uint64_t step = 0; step < 3; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 90 + step);
    for (size_t i = 0; i < n; ++i) velocity[i] = c.momentum * velocity[i] + g[i];
    codec.encode(g.data(), n, *st, payload);
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(st->u[i], velocity[i], 1e-5 * (1.0 + std::fabs(velocity[i]))) << i;
  }
}

// About 11.5 bits per position (golomb.h), one more with both sides.
TEST_P(SbcSides, PayloadIsOverTwoThousandTimesSmallerAtDensityOnePerMille) {
  const size_t n = 4'000'000;
  SbcConfig c{0.001, 0.01};
  c.both_sides = GetParam();
  EXPECT_GT(double(n * 4) / first_payload(c, n, 4).size(), 2000.0);
}

TEST(Sbc, RejectsCorruptHeadersAndTruncatedMeans) {
  const size_t n = 10000;
  const Bytes payload = first_payload(SbcConfig{0.01, 0.01}, n, 4);
  std::vector<float> out(n, 0.0f);
  Bytes bad = payload;
  bad[5] = 7;  // side flag
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  bad = payload;
  bad[4] = 40;  // Golomb parameter > 31
  EXPECT_THROW(decode_sbc_accumulate(bad, out.data(), n), Error);
  EXPECT_THROW(decode_sbc_accumulate({payload.data(), kPayloadHeaderBytes + 2}, out.data(), n),
               Error);
  EXPECT_EQ(out, std::vector<float>(n, 0.0f));
}

// append_payload_indices (the support the host hierarchy shares a sparse
// result by) must name every word decode_accumulate writes, for both payload
// formats, non-finite entries of sbc included; and it rejects what the
// decoder rejects.
TEST(PayloadIndices, NameEveryWordTheDecodeWrites) {
  const size_t n = 20000;
  auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 3);
  g[77] = std::numeric_limits<float>::quiet_NaN();
  g[78] = -std::numeric_limits<float>::infinity();
  DgcConfig dc;
  dc.density = 0.01;
  std::vector<std::unique_ptr<SparseCodec>> codecs;
  codecs.push_back(std::make_unique<DgcCodec>(dc));
  codecs.push_back(std::make_unique<SbcCodec>(SbcConfig{0.01, 0.01}));
  SbcConfig both{0.01, 0.01};
  both.both_sides = true;
  codecs.push_back(std::make_unique<SbcCodec>(both));
  for (const auto& codec : codecs) {
    SCOPED_TRACE(codec->name());
    auto st = codec->make_state(n);
    Bytes payload;
    codec->encode(g.data(), n, *st, payload);
    std::vector<float> out(n, 0.0f);
    decode_accumulate(payload, out.data(), n);
    std::vector<uint32_t> listed = {5};  // appended to, not replaced
    append_payload_indices(payload, n, listed);
    std::vector<bool> named(n, false);
    for (const uint32_t i : listed) named[i] = true;
    size_t written = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &out[i], sizeof bits);
      if (bits == 0) continue;
      ++written;
      EXPECT_TRUE(named[i]) << "element " << i << " is written but not listed";
    }
    EXPECT_GE(written, 100u);
    EXPECT_TRUE(std::isnan(out[77]) && named[77] && named[78]);
    EXPECT_EQ(listed[0], 5u);

    Bytes bad = payload;
    bad[3] = 0x7f;  // an unknown format
    std::vector<uint32_t> none;
    EXPECT_THROW(append_payload_indices(bad, n, none), Error);
  }
}

}  // namespace
}  // namespace compcoll
