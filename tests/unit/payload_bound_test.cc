// max_payload_bytes(n), the bound the transports enforce on what a peer may
// announce, holds every payload the real encoders produce for n elements,
// including their worst cases (everything selected, everything non-finite,
// the smallest onebit blocks), and stays a small multiple of the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/onebit.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

using Input = std::function<std::vector<float>(size_t n)>;

std::vector<std::pair<std::string, Input>> inputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  return {
      {"gaussian", [](size_t n) { return bench::make_gradient(bench::GradientKind::kGaussian, n, 5); }},
      {"all NaN", [=](size_t n) { return std::vector<float>(n, nan); }},
      {"alternating +-Inf",
       [=](size_t n) {
         std::vector<float> v(n);
         for (size_t i = 0; i < n; ++i) v[i] = i % 2 ? inf : -inf;
         return v;
       }},
  };
}

const size_t kSizes[] = {1, 7, 8, 9, 1000, 65537};

void expect_within_bound(const std::string& what, size_t n, const Bytes& payload) {
  EXPECT_LE(payload.size(), max_payload_bytes(n)) << what << ", n = " << n;
}

TEST(PayloadBound, HoldsEverySparseAndSbcPayloadIncludingWorstCases) {
  for (const auto& [input_name, make] : inputs()) {
    for (size_t n : kSizes) {
      const std::vector<float> g = make(n);
      for (ValueType vt : {ValueType::kFp32, ValueType::kFp16, ValueType::kFp8}) {
        for (IndexType it : {IndexType::kU32, IndexType::kVarintGap, IndexType::kRiceGap}) {
          for (double density : {0.001, 0.5, 1.0}) {
            DgcConfig dc;
            dc.density = density;
            dc.encoding = {vt, it};
            SdagcConfig sc;
            sc.density = density;
            sc.encoding = {vt, it};
            const DgcCodec dgc(dc);
            const SdagcCodec sdagc(sc);
            for (const SparseCodec* codec : std::initializer_list<const SparseCodec*>{&dgc, &sdagc}) {
              auto st = codec->make_state(n);
              Bytes payload;
              codec->encode(g.data(), n, *st, payload);
              expect_within_bound(std::string(codec->name()) + " " + input_name, n, payload);
            }
          }
        }
      }
      for (double density : {0.001, 0.5, 1.0}) {
        for (bool both_sides : {false, true}) {
          SbcConfig c{density, 0.01};
          c.both_sides = both_sides;
          const SbcCodec sbc(c);
          auto st = sbc.make_state(n);
          Bytes payload;
          sbc.encode(g.data(), n, *st, payload);
          expect_within_bound(std::string(both_sides ? "sbc both sides " : "sbc ") + input_name, n,
                              payload);
        }
      }
    }
  }
}

TEST(PayloadBound, HoldsEveryOnebitPayloadIncludingWorstCases) {
  for (const auto& [input_name, make] : inputs()) {
    for (size_t n : kSizes) {
      const std::vector<float> g = make(n);
      for (size_t block : {size_t{8}, size_t{64}, size_t{2048}}) {
        for (ScaleMode mode : {ScaleMode::kMeanMagnitude, ScaleMode::kSignedMeans}) {
          std::vector<float> err(n, 0.0f);
          Bytes payload;
          onebit_encode(OneBitConfig{block, mode}, g.data(), err.data(), n, payload);
          expect_within_bound("onebit block " + std::to_string(block) + " " + input_name, n,
                              payload);
        }
      }
    }
  }
}

TEST(PayloadBound, IsASmallMultipleOfTheTensor) {
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, uint64_t{25557032}}) {
    EXPECT_GE(max_payload_bytes(n), 24u);
    EXPECT_LE(max_payload_bytes(n), 17 * n + 128) << n;  // 4n bytes of fp32: at most ~4.2x
  }
  // No overflow for absurd sizes: the bound saturates instead of wrapping.
  EXPECT_EQ(max_payload_bytes(std::numeric_limits<uint64_t>::max()),
            std::numeric_limits<size_t>::max());
}

}  // namespace
}  // namespace compcoll
