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
    EXPECT_GT(e.mean * sign, 5.0f);
    for (uint32_t i : e.idx) EXPECT_GT(g[i] * sign, 0.0f);
  }
}

// DGC's momentum correction in sbc: what v accumulates is the velocity u
// (u = m*u + g), nothing is lost (every velocity added so far = what was
// sent + the residual), and momentum factor masking restarts u at zero
// exactly where positions were sent.
TEST(Sbc, MomentumCorrectionLosesNothingAndMasksTheSentPositions) {
  const size_t n = 50000;
  SbcConfig c{0.01, 0.01};
  c.momentum = 0.9f;
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
    for (uint32_t i : e.idx) {
      sent[i] += e.mean;
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
    EXPECT_DOUBLE_EQ(info.density, warmup_density(0.001, 8, step)) << step;
    const size_t sent = decode_sbc(payload, n).idx.size();  // one side: 80-100 % of k
    EXPECT_LE(sent, info.wanted) << step;
    EXPECT_GE(sent * 5, info.wanted * 4) << step;
  }
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 8, 0), 0.25);
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 8, 9), 0.001);
  c.warmup_steps = -1;
  EXPECT_THROW(SbcCodec{c}, Error);
}

// COMPCOLL_SBC_WARMUP=exact: over the warm-up sbc is dgc on the same state
// (the same payload bytes, residual and velocity as a DgcCodec of
// sbc_warmup_config given the same gradients), and binarises after it;
// nothing is lost across the switch.
TEST(Sbc, ExactWarmUpIsDgcThenBinarises) {
  const size_t n = 60000;
  SbcConfig c{0.001, 0.01};
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
    EXPECT_DOUBLE_EQ(info.density, warmup_density(0.001, 6, step)) << step;
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

TEST(Sbc, PayloadIsOverTwoThousandTimesSmallerAtDensityOnePerMille) {
  const size_t n = 4'000'000;
  SbcCodec codec(SbcConfig{0.001, 0.01});
  auto st = codec.make_state(n);
  const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 4);
  Bytes payload;
  codec.encode(g.data(), n, *st, payload);
  EXPECT_GT(double(n * 4) / payload.size(), 2000.0);
}

TEST(Sbc, RejectsCorruptHeadersAndTruncatedMeans) {
  const size_t n = 10000;
  SbcCodec codec(SbcConfig{0.01, 0.01});
  auto st = codec.make_state(n);
  const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 4);
  Bytes payload;
  codec.encode(g.data(), n, *st, payload);
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
