// libFuzzer target: the 1-bit decoder (compression/onebit.h: onebit_decode),
// in overwrite and accumulate mode (flag bit 1).
//
// Checks, beyond fuzz_common.h's rules:
//   - an accepted payload has exactly the size its header implies (scales,
//     ceil(n/8) sign bytes, then the non-finite list), a scale mode it
//     knows, a block size in [8, 2^24], k = ceil(n / block), and finite
//     scales;
//   - the output equals a plain scalar reference computed here from the
//     payload's scales and sign bits (the decoder uses SIMD), followed by the
//     non-finite list; NaN matches NaN;
//   - with flag bit 2 the other mode is decoded too, and accumulating onto
//     zeros must equal overwriting (up to the sign of zero: -0 + 0 = +0).
#include <bit>
#include <cmath>
#include <cstdint>

#include "compression/non_finite.h"
#include "compression/onebit.h"
#include "compression/payload.h"
#include "tests/fuzz/fuzz_common.h"

using namespace compcoll;
using namespace compcoll::fuzz;

namespace {

// The payload's meaning, computed independently of onebit.cc.
std::vector<float> reference(std::span<const uint8_t> p, uint64_t n, const std::vector<float>& before,
                             bool accumulate) {
  const size_t per = p[4] == 1 ? 2 : 1;
  const uint64_t block = uint64_t{1} << p[5];
  const uint64_t blocks = (n + block - 1) / block;
  const uint8_t* scales = p.data() + kPayloadHeaderBytes;
  const uint8_t* bits = scales + blocks * per * 4;
  std::vector<float> out = before;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t b = i / block;
    float pos, negmag;
    std::memcpy(&pos, scales + b * per * 4, 4);
    if (per == 2) {
      std::memcpy(&negmag, scales + b * per * 4 + 4, 4);
    } else {
      negmag = pos;
    }
    const bool negative = (bits[i / 8] >> (i % 8)) & 1u;
    const float val = negative ? -negmag : pos;
    out[i] = accumulate ? out[i] + val : val;
  }
  std::vector<NonFinite> odd;
  const size_t fixed = kPayloadHeaderBytes + blocks * per * 4 + (n + 7) / 8;
  FUZZ_CHECK(parse_non_finite(p, fixed, n, odd) == p.size(), "accepted payload has trailing bytes");
  for (const NonFinite& e : odd) {
    FUZZ_CHECK(!std::isfinite(e.value), "a finite value in the non-finite list");
    out[e.idx] = accumulate ? out[e.idx] + e.value : e.value;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecoderInput in = split_input(data, size);
  const uint64_t n = in.n;
  const bool acc = in.accumulate();

  std::vector<float> out = initial_output(n);
  const std::vector<float> before = out;
  const bool ok = decode_checked(out, [&](float* o) { onebit_decode(in.payload, o, n, acc); });
  std::vector<float> other;
  if (in.secondary()) {
    other = acc ? std::vector<float>(n, 0.0f) : initial_output(n);
    const bool ok2 = decode_checked(other, [&](float* o) { onebit_decode(in.payload, o, n, !acc); });
    FUZZ_CHECK(ok == ok2, "accumulate and overwrite mode disagree on validity");
  }
  if (!ok) return 0;

  FUZZ_CHECK(in.payload[4] <= 1, "unknown scale mode accepted");
  FUZZ_CHECK(in.payload[5] >= 3 && in.payload[5] <= 24, "block size outside [8, 2^24] accepted");
  const uint64_t k = read_header(in.payload, PayloadFormat::kOneBit, n).k;
  const uint64_t block = uint64_t{1} << in.payload[5];
  FUZZ_CHECK(k == (n + block - 1) / block, "block count differs from ceil(n / block)");
  // Scales are finite: the encoder sends NaN/Inf elements in the
  // non-finite list instead, and a non-finite scale would spread over a
  // whole block (sbc likewise rejects a non-finite mean).
  const size_t per = in.payload[4] == 1 ? 2 : 1;
  for (uint64_t i = 0; i < k * per; ++i) {
    float s;
    std::memcpy(&s, in.payload.data() + kPayloadHeaderBytes + 4 * i, 4);
    FUZZ_CHECK(std::isfinite(s), "a non-finite onebit scale was accepted");
  }
  const std::vector<float> expect = reference(in.payload, n, before, acc);
  FUZZ_CHECK(same_values(out, expect), "onebit_decode differs from the scalar reference");
  if (in.secondary() && acc) {
    // `other` holds the overwrite decode; accumulating onto zeros must agree.
    std::vector<float> zeros(n, 0.0f);
    decode_checked(zeros, [&](float* o) { onebit_decode(in.payload, o, n, true); });
    for (uint64_t i = 0; i < n; ++i) {
      FUZZ_CHECK(zeros[i] == other[i] || (zeros[i] != zeros[i] && other[i] != other[i]),
                 "0 + decode differs from decode");
    }
  }
  return 0;
}
