#include <gtest/gtest.h>

#include <cmath>

#include "compcoll/error.h"
#include "compression/csc.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

TEST(Csc, NormsAreChunkL1NormsIncludingARaggedLastChunk) {
  CscConfig c;
  c.chunk = 100;
  const size_t n = 1050;
  auto st = make_csc_state(c, n);
  const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 1);
  std::vector<float> norms(csc_chunk_count(n, c.chunk));
  ASSERT_EQ(norms.size(), 11u);
  csc_accumulate_norms(c, g.data(), n, *st, norms.data());
  for (size_t ch = 0; ch < norms.size(); ++ch) {
    double s = 0;
    for (size_t i = ch * 100; i < std::min(n, ch * 100 + 100); ++i) s += std::fabs(g[i]);
    EXPECT_NEAR(norms[ch], s, 1e-4 * s);
  }
}

TEST(Csc, SelectsTheLargestNormsWithTiesToTheLowerIndexAndNanFirst) {
  const float norms[] = {1, 5, 3, 5, 0, 5, 2};
  EXPECT_EQ(csc_select_chunks(norms, 7, 2), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(csc_select_chunks(norms, 7, 4), (std::vector<uint32_t>{1, 2, 3, 5}));
  const float with_nan[] = {1, NAN, 3};
  EXPECT_EQ(csc_select_chunks(with_nan, 3, 1), (std::vector<uint32_t>{1}));
  EXPECT_EQ(csc_selected_count(1560, 0.01), 16u);
  EXPECT_EQ(csc_selected_count(3, 0.01), 1u);
  EXPECT_EQ(csc_selected_count(0, 0.01), 0u);
}

TEST(Csc, PackUnpackCommitLoseNothingOverManySteps) {
  CscConfig c;
  c.chunk = 64;
  c.fraction = 0.1;
  const size_t n = 6400 + 17;
  auto st = make_csc_state(c, n);
  std::vector<double> input(n, 0.0), sent(n, 0.0);
  std::vector<float> norms(csc_chunk_count(n, c.chunk)), packed, out(n);
  for (int step = 0; step < 100; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, step);
    for (size_t i = 0; i < n; ++i) input[i] += g[i];
    csc_accumulate_norms(c, g.data(), n, *st, norms.data());
    const auto chunks = csc_select_chunks(norms.data(), norms.size(),
                                          csc_selected_count(norms.size(), c.fraction));
    csc_pack(*st, chunks, c.chunk, packed);
    csc_commit(*st, chunks, c.chunk);
    csc_unpack(packed.data(), chunks, c.chunk, n, out.data());
    for (size_t i = 0; i < n; ++i) sent[i] += out[i];
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sent[i] + st->v[i], input[i], 1e-4 * (1 + std::fabs(input[i]))) << i;
  }
}

TEST(Csc, MomentumMaskingZeroesTheVelocityOfSentChunksOnlyWhenOn) {
  for (const bool masking : {true, false}) {
    CscConfig c;
    c.chunk = 64;
    c.fraction = 0.25;
    c.momentum = 0.9f;
    c.masking = masking;
    const size_t n = 64 * 8;
    auto st = make_csc_state(c, n);
    std::vector<float> norms(csc_chunk_count(n, c.chunk));
    const auto g = bench::make_gradient(bench::GradientKind::kGaussian, n, 5);
    csc_accumulate_norms(c, g.data(), n, *st, norms.data());
    const auto chunks = csc_select_chunks(norms.data(), norms.size(),
                                          csc_selected_count(norms.size(), c.fraction));
    ASSERT_EQ(chunks.size(), 2u);
    csc_commit(*st, chunks, c.chunk, c.masking);
    for (uint32_t ch : chunks) {
      for (size_t i = ch * c.chunk; i < (ch + 1) * c.chunk; ++i) {
        EXPECT_EQ(st->v[i], 0.0f);
        // First step: u = g. Masking off keeps it, so the next steps still
        // add the gradient's momentum to v, as dense momentum SGD would.
        EXPECT_EQ(st->u[i], masking ? 0.0f : g[i]) << "masking " << masking << " at " << i;
      }
    }
  }
}

TEST(Csc, RejectsInvalidConfiguration) {
  CscConfig c;
  c.chunk = 0;
  EXPECT_THROW(validate_csc_config(c), Error);
  c.chunk = 16;
  c.fraction = 0;
  EXPECT_THROW(validate_csc_config(c), Error);
}

}  // namespace
}  // namespace compcoll
