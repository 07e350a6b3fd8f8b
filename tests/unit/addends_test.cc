// The host hierarchy's fused local reduce: a codec that takes the other
// local ranks' buffers as Addends (compression/codec.h) must give the bits
// that adding them into the gradient first gives, payload and state alike,
// wherever the addends lie and whatever the momentum.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "compcoll/error.h"
#include "compression/accumulate.h"
#include "compression/codec.h"
#include "compression/dgc.h"
#include "compression/sdagc.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

using bench::GradientKind;

struct Case {
  float momentum;
  bool nesterov;
  size_t parts;
  size_t off;
  size_t len;
};

// Runs `steps` encodes both ways on the same inputs and compares every
// payload byte and every state word.
void expect_fused_equals_added_first(const SparseCodec& codec, size_t n, const Case& c,
                                     int steps) {
  auto fused = codec.make_state(n);
  auto added = codec.make_state(n);
  for (int step = 0; step < steps; ++step) {
    const auto g = bench::make_gradient(GradientKind::kStudentT3, n, 100 + step);
    std::vector<std::vector<float>> parts;
    Addends add;
    add.off = c.off;
    add.len = c.len;
    for (size_t p = 0; p < c.parts; ++p) {
      parts.push_back(bench::make_gradient(GradientKind::kStudentT3, c.len, 7 * step + p + 1));
      add.parts.push_back(parts.back().data());
    }
    std::vector<float> g_fused = g, g_added = g;
    Bytes p_fused, p_added;
    encode_with_addends(codec, g_fused.data(), add, n, *fused, p_fused);
    add_addends(g_added.data(), add);
    codec.encode(g_added.data(), n, *added, p_added);
    ASSERT_EQ(p_fused, p_added) << "step " << step;
    ASSERT_EQ(fused->v, added->v) << "step " << step;
    ASSERT_EQ(fused->u, added->u) << "step " << step;
    if (codec.fuses_addends()) {
      ASSERT_EQ(g_fused, g) << "a fusing codec must not write the gradient";
    }
  }
}

TEST(Addends, DgcTakesThemInItsPassWithTheBitsOfAddingThemFirst) {
  const size_t n = 100003;  // not a multiple of the 16-element blocks
  const Case cases[] = {
      {0.0f, false, 1, 0, n},          {0.0f, false, 3, 5, n - 8},
      {0.9f, false, 1, 40000, 60003},  {0.9f, true, 2, n - 17, 17},
      {0.9f, true, 1, 3, 0},           {0.0f, false, 1, 0, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "momentum " << c.momentum << " nesterov " << c.nesterov
                                    << " parts " << c.parts << " [" << c.off << ", "
                                    << c.off + c.len << ")");
    DgcConfig config;
    config.density = 0.01;
    config.momentum = c.momentum;
    config.nesterov = c.nesterov;
    const DgcCodec codec(config);
    ASSERT_TRUE(codec.fuses_addends());
    expect_fused_equals_added_first(codec, n, c, 4);
  }
}

TEST(Addends, CodecsThatCannotFuseGetThemAddedFirst) {
  const size_t n = 20000;
  DgcConfig clipped;
  clipped.clip = 1.0f;
  const DgcCodec dgc(clipped);
  EXPECT_FALSE(dgc.fuses_addends()) << "clipping needs the sum's norm before the pass";
  expect_fused_equals_added_first(dgc, n, {0.0f, false, 2, 100, 5000}, 3);

  const SdagcCodec sdagc(SdagcConfig{});
  EXPECT_FALSE(sdagc.fuses_addends());
  expect_fused_equals_added_first(sdagc, n, {0.0f, false, 1, 0, n}, 3);
  std::vector<float> g(n, 1.0f);
  Bytes payload;
  auto st = sdagc.make_state(n);
  Addends add;
  add.parts.push_back(g.data());
  add.len = n;
  EXPECT_THROW(sdagc.encode_sum(g.data(), add, n, *st, payload), Error);
}

TEST(Addends, OutsideTheTensorIsRefused) {
  const size_t n = 1000;
  const DgcCodec codec(DgcConfig{});
  auto st = codec.make_state(n);
  std::vector<float> g(n, 1.0f);
  Addends add;
  add.parts.push_back(g.data());
  add.off = 10;
  add.len = n;
  Bytes payload;
  EXPECT_THROW(codec.encode_sum(g.data(), add, n, *st, payload), Error);
}

}  // namespace
}  // namespace compcoll
