// libFuzzer target: the Sparse Binary Compression decoder
// (compression/sbc.h: decode_sbc_accumulate, decode_sbc) and the Golomb-Rice
// position decoder under it (compression/golomb.h: rice_decode_positions).
//
// Checks, beyond fuzz_common.h's rules:
//   - decode_sbc and decode_sbc_accumulate accept exactly the same payloads;
//   - positions are strictly increasing, < n, exactly header-k of them;
//   - the accumulate result equals out[p] += its mean at every position,
//     then out[i] += value for every entry of the non-finite list;
//   - the means are finite, a one-side payload uses only its first, a
//     both-sides payload's side bits are 0 or 1 per position, and a side no
//     position takes has mean 0; the non-finite list holds only NaN/Inf at
//     increasing indices < n;
//   - the format is canonical: header + means + non-finite list (+ sign
//     bits) + rice_encode_positions(positions), written here independently
//     of write_sbc_payload, reproduces the accepted payload byte for byte (so
//     no two accepted payloads mean the same thing, and the padding of the
//     sign bits and of the Rice stream is really checked);
//   - with flag bit 2, rice_decode_positions is also called directly on the
//     body with k, b and n taken from the input, and must either throw
//     kMalformedPayload or return k increasing positions < n whose encoding
//     is the consumed prefix of the stream.
#include <cmath>
#include <cstdint>

#include "compression/golomb.h"
#include "compression/non_finite.h"
#include "compression/payload.h"
#include "compression/sbc.h"
#include "tests/fuzz/fuzz_common.h"

using namespace compcoll;
using namespace compcoll::fuzz;

namespace {

void check_positions(const std::vector<uint32_t>& idx, uint64_t n) {
  for (size_t i = 0; i < idx.size(); ++i) {
    FUZZ_CHECK(idx[i] < n, "position out of range");
    FUZZ_CHECK(i == 0 || idx[i] > idx[i - 1], "positions are not strictly increasing");
  }
}

// rice_decode_positions on raw bits with parameters from the input.
void fuzz_rice_directly(std::span<const uint8_t> bytes) {
  if (bytes.size() < 6) return;
  const int b = static_cast<int>(bytes[0] % 40) - 4;  // includes invalid -4..-1 and 32..35
  const uint64_t k = uint64_t{bytes[1]} | (uint64_t{bytes[2]} << 8);
  const uint64_t n = uint64_t{bytes[3]} | (uint64_t{bytes[4]} << 8) | (uint64_t{bytes[5]} << 16);
  const std::span<const uint8_t> bits = bytes.subspan(6);
  std::vector<uint32_t> idx;
  if (!decodes([&] { idx = rice_decode_positions(bits, k, b, n); })) return;
  FUZZ_CHECK(b >= 0 && b <= 31, "an invalid Rice parameter was accepted");
  FUZZ_CHECK(idx.size() == k, "rice_decode_positions returned the wrong count");
  check_positions(idx, n);
  Bytes again;
  rice_encode_positions(idx, b, again);
  FUZZ_CHECK(same_bytes(again, bits), "accepted Rice stream is not the canonical encoding of its positions");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecoderInput in = split_input(data, size);
  const uint64_t n = in.n;

  if (in.secondary()) fuzz_rice_directly(in.payload);

  std::vector<float> out = initial_output(n);
  const std::vector<float> before = out;
  const bool ok = decode_checked(out, [&](float* o) { decode_sbc_accumulate(in.payload, o, n); });

  SbcEntries e;
  const bool ok2 = decodes([&] { e = decode_sbc(in.payload, n); });
  FUZZ_CHECK(ok == ok2, "decode_sbc and decode_sbc_accumulate disagree on validity");
  if (!ok) return 0;

  const uint64_t k = read_header(in.payload, PayloadFormat::kSbc, n).k;
  FUZZ_CHECK(e.idx.size() == k, "position count differs from the header's k");
  check_positions(e.idx, n);

  const bool both = in.payload[5] == kSbcBothSides;
  FUZZ_CHECK(std::isfinite(e.means[0]) && std::isfinite(e.means[1]),
             "a non-finite sbc mean was accepted");
  FUZZ_CHECK(e.side.size() == k, "one side entry per position");
  bool used[2] = {false, false};
  for (uint8_t s : e.side) {
    FUZZ_CHECK(s <= (both ? 1 : 0), "a position takes a mean its payload does not have");
    used[s] = true;
  }
  if (both) {
    FUZZ_CHECK((used[0] || e.means[0] == 0.0f) && (used[1] || e.means[1] == 0.0f),
               "a side without positions has a mean other than 0");
  } else {
    FUZZ_CHECK(e.means[1] == 0.0f, "a one-side payload has a second mean");
  }
  for (size_t i = 0; i < e.non_finite.size(); ++i) {
    FUZZ_CHECK(e.non_finite[i].idx < n, "non-finite entry out of range");
    FUZZ_CHECK(i == 0 || e.non_finite[i].idx > e.non_finite[i - 1].idx,
               "non-finite indices are not strictly increasing");
    FUZZ_CHECK(!std::isfinite(e.non_finite[i].value), "a finite value in the non-finite list");
  }

  std::vector<float> expect = before;
  for (size_t j = 0; j < e.idx.size(); ++j) expect[e.idx[j]] += e.means[e.side[j]];
  for (const NonFinite& x : e.non_finite) expect[x.idx] += x.value;
  FUZZ_CHECK(same_values(out, expect), "decode_sbc_accumulate differs from out[p] += mean");

  // Canonical form: header (as written by the encoder) + means + sign bits +
  // Rice bits.
  const size_t means = both ? 8 : 4;
  Bytes again(kPayloadHeaderBytes + means);
  write_header({PayloadFormat::kSbc, in.payload[4], in.payload[5], n, k}, again.data());
  std::memcpy(again.data() + kPayloadHeaderBytes, in.payload.data() + kPayloadHeaderBytes, means);
  append_non_finite(again, e.non_finite);
  if (both) {
    const size_t at = again.size();
    again.resize(at + (k + 7) / 8, 0);
    for (size_t j = 0; j < k; ++j) again[at + j / 8] |= uint8_t(e.side[j] << (j % 8));
  }
  rice_encode_positions(e.idx, in.payload[4], again);
  FUZZ_CHECK(same_bytes(again, in.payload), "accepted sbc payload is not the canonical encoding of its positions");
  return 0;
}
