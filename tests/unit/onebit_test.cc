#include <gtest/gtest.h>

#include <cmath>

#include "compcoll/error.h"
#include "compression/onebit.h"
#include "compression/payload.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

class OneBitTest : public ::testing::TestWithParam<ScaleMode> {};

TEST_P(OneBitTest, ErrorFeedbackKeepsExactlyWhatWasNotSent) {
  const OneBitConfig c{64, GetParam()};
  const size_t n = 64 * 50 + 13;  // a ragged last block
  std::vector<float> err(n, 0.0f), out(n);
  std::vector<double> input(n, 0.0), sent(n, 0.0);
  Bytes payload;
  for (int step = 0; step < 100; ++step) {
    const auto x = bench::make_gradient(bench::GradientKind::kStudentT3, n, step);
    for (size_t i = 0; i < n; ++i) input[i] += x[i];
    onebit_encode(c, x.data(), err.data(), n, payload);
    EXPECT_EQ(payload.size(), onebit_payload_bytes(n, c));
    onebit_decode(payload, out.data(), n, /*accumulate=*/false);
    for (size_t i = 0; i < n; ++i) sent[i] += out[i];
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sent[i] + err[i], input[i], 1e-3 * (1 + std::fabs(input[i]))) << i;
  }
}

TEST_P(OneBitTest, SignsAndScalesDecodeAsSpecified) {
  const OneBitConfig c{8, GetParam()};
  const float x[16] = {1, -2, 3, -4, 5, -6, 7, -8, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, -0.5f};
  std::vector<float> err(16, 0.0f), out(16);
  Bytes payload;
  onebit_encode(c, x, err.data(), 16, payload);
  onebit_decode(payload, out.data(), 16, false);
  if (GetParam() == ScaleMode::kMeanMagnitude) {
    EXPECT_EQ(out[0], 4.5f);  // mean |x| of block 0
    EXPECT_EQ(out[1], -4.5f);
    EXPECT_EQ(out[8], 0.5f);
    EXPECT_EQ(out[15], -0.5f);
  } else {
    EXPECT_EQ(out[0], 4.0f);   // mean of 1, 3, 5, 7
    EXPECT_EQ(out[1], -5.0f);  // minus mean of 2, 4, 6, 8
    EXPECT_EQ(out[15], -0.5f);
  }
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(out[i] + err[i], x[i]);
}

TEST_P(OneBitTest, DecoderRejectsMalformedPayloads) {
  const OneBitConfig c{64, GetParam()};
  const size_t n = 1000;
  const auto x = bench::make_gradient(bench::GradientKind::kGaussian, n, 1);
  std::vector<float> err(n, 0.0f), out(n, 0.0f);
  Bytes payload;
  onebit_encode(c, x.data(), err.data(), n, payload);
  for (size_t len = 0; len < payload.size(); ++len) {
    EXPECT_THROW(onebit_decode({payload.data(), len}, out.data(), n, true), Error);
  }
  Bytes bad = payload;
  bad[5] = 2;  // block 4 < 8
  EXPECT_THROW(onebit_decode(bad, out.data(), n, true), Error);
  bad = payload;
  bad[5] = 7;  // block 128: block count and length disagree
  EXPECT_THROW(onebit_decode(bad, out.data(), n, true), Error);
  EXPECT_THROW(onebit_decode(payload, out.data(), n - 1, true), Error);
  EXPECT_EQ(out, std::vector<float>(n, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(ScaleModes, OneBitTest,
                         ::testing::Values(ScaleMode::kMeanMagnitude, ScaleMode::kSignedMeans));

TEST(OneBit, PayloadIsOverThirtyTimesSmallerThanFp32) {
  const size_t n = 1 << 20;
  EXPECT_GT(double(n * 4) / onebit_payload_bytes(n, OneBitConfig{}), 30.0);
  EXPECT_GT(double(n * 4) / onebit_payload_bytes(n, OneBitConfig{2048, ScaleMode::kSignedMeans}),
            30.0);
}

TEST(OneBit, RejectsBlockSizesThatAreNotPowersOfTwo) {
  EXPECT_THROW(validate_onebit_config(OneBitConfig{100, ScaleMode::kMeanMagnitude}), Error);
  EXPECT_THROW(validate_onebit_config(OneBitConfig{4, ScaleMode::kMeanMagnitude}), Error);
}

}  // namespace
}  // namespace compcoll
