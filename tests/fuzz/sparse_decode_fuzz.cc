// libFuzzer target: the sparse payload decoder of dgc and sdagc
// (compression/sparse_payload.h: decode_sparse_accumulate, decode_sparse).
//
// Checks, beyond fuzz_common.h's rules:
//   - decode_sparse and decode_sparse_accumulate accept exactly the same
//     payloads;
//   - every decoded index is < n and there are exactly header-k of them;
//   - the accumulate result equals out[idx] += value applied here, in order;
//   - gap-coded (varint, Rice) indices are strictly increasing (that is how
//     they are built); entries with strictly increasing indices survive a
//     round trip through encode_sparse with the payload's own encoding (fp8:
//     the re-encoding's scale is never larger, so its values are exact).
#include <cmath>
#include <cstdint>
#include <limits>

#include "compression/payload.h"
#include "compression/sparse_payload.h"
#include "tests/fuzz/fuzz_common.h"

using namespace compcoll;
using namespace compcoll::fuzz;

namespace {

bool same_value(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;  // fp16/bf16/fp8 re-encoding quiets NaN payloads
  return std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecoderInput in = split_input(data, size);
  const uint64_t n = in.n;

  std::vector<float> out = initial_output(n);
  const std::vector<float> before = out;
  const bool ok = decode_checked(out, [&](float* o) { decode_sparse_accumulate(in.payload, o, n); });

  SparseEntries e;
  const bool ok2 = decodes([&] { e = decode_sparse(in.payload, n); });
  FUZZ_CHECK(ok == ok2, "decode_sparse and decode_sparse_accumulate disagree on validity");
  if (!ok) return 0;

  // The header is valid here: read what it promised.
  const uint8_t value_type = in.payload[4];
  const uint8_t index_type = in.payload[5];
  const uint64_t k = read_header(in.payload, PayloadFormat::kSparse, n).k;
  FUZZ_CHECK(e.idx.size() == k && e.values.size() == k, "entry count differs from the header's k");

  std::vector<float> expect = before;
  bool increasing = true;
  for (size_t i = 0; i < e.idx.size(); ++i) {
    FUZZ_CHECK(e.idx[i] < n, "decoded index out of range");
    if (i > 0 && e.idx[i] <= e.idx[i - 1]) increasing = false;
    expect[e.idx[i]] += e.values[i];
  }
  FUZZ_CHECK(same_values(out, expect), "decode_sparse_accumulate differs from out[idx] += value");
  if (index_type == static_cast<uint8_t>(IndexType::kVarintGap) ||
      index_type == static_cast<uint8_t>(IndexType::kRiceGap)) {
    FUZZ_CHECK(increasing, "index gaps decoded to indices that are not strictly increasing");
  }

  // Round trip through the encoder with the payload's own encoding.
  if (increasing && n <= std::numeric_limits<uint32_t>::max()) {
    const SparseEncoding enc{static_cast<ValueType>(value_type), static_cast<IndexType>(index_type)};
    std::vector<float> values = e.values;
    Bytes again;
    encode_sparse(e.idx, values, n, enc, again);
    SparseEntries back;
    FUZZ_CHECK(decodes([&] { back = decode_sparse(again, n); }), "re-encoded payload does not decode");
    FUZZ_CHECK(back.idx == e.idx, "round trip changed the indices");
    for (size_t i = 0; i < back.values.size(); ++i) {
      FUZZ_CHECK(same_value(back.values[i], e.values[i]), "round trip changed a value");
    }
    if (enc.values == ValueType::kFp32 && enc.indices == IndexType::kU32) {
      FUZZ_CHECK(same_bytes(again, in.payload), "u32/fp32 payloads are canonical: re-encoding must give the same bytes");
    }
  }
  return 0;
}
