// libFuzzer target: the format-dispatching decoder (compression/decode.h:
// decode_accumulate), what the sparse-allgather collective runs on every
// peer's payload.
//
// Checks, beyond fuzz_common.h's rules: decode_accumulate behaves exactly
// like the decoder its header's format byte names (decode_sparse_accumulate
// for format 1, decode_sbc_accumulate for format 2: same validity, same
// output bits), and rejects every other format (onebit payloads included:
// they are not sparse contributions).
#include <cstdint>

#include "compression/decode.h"
#include "compression/sbc.h"
#include "compression/sparse_payload.h"
#include "tests/fuzz/fuzz_common.h"

using namespace compcoll;
using namespace compcoll::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecoderInput in = split_input(data, size);
  const uint64_t n = in.n;

  std::vector<float> out = initial_output(n);
  const bool ok = decode_checked(out, [&](float* o) { decode_accumulate(in.payload, o, n); });

  const std::span<const uint8_t> p = in.payload;
  const bool header_ok = p.size() >= kPayloadHeaderBytes && p[0] == 0x0C && p[1] == 0xCC &&
                         p[2] == kPayloadVersion;
  const uint8_t format = header_ok ? p[3] : 0;

  std::vector<float> direct = initial_output(n);
  bool direct_ok = false;
  if (format == static_cast<uint8_t>(PayloadFormat::kSparse)) {
    direct_ok = decode_checked(direct, [&](float* o) { decode_sparse_accumulate(p, o, n); });
  } else if (format == static_cast<uint8_t>(PayloadFormat::kSbc)) {
    direct_ok = decode_checked(direct, [&](float* o) { decode_sbc_accumulate(p, o, n); });
  }
  FUZZ_CHECK(ok == direct_ok, "decode_accumulate's validity differs from its format's decoder");
  if (ok) FUZZ_CHECK(same_bits(out, direct), "decode_accumulate's output differs from its format's decoder");
  return 0;
}
