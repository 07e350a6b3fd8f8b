#include "compression/decode.h"

#include <algorithm>
#include <limits>

#include "compression/non_finite.h"
#include "compression/onebit.h"
#include "compression/payload.h"
#include "compression/sbc.h"
#include "compression/sparse_payload.h"

namespace compcoll {

void decode_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n) {
  switch (peek_format(payload)) {
    case PayloadFormat::kSparse: return decode_sparse_accumulate(payload, out, n);
    case PayloadFormat::kSbc: return decode_sbc_accumulate(payload, out, n);
    default:
      CC_THROW(kMalformedPayload, "payload format ", int(payload[3]),
               " cannot be accumulated as a sparse contribution");
  }
}

void append_payload_indices(std::span<const uint8_t> payload, uint64_t n,
                            std::vector<uint32_t>& out) {
  switch (peek_format(payload)) {
    case PayloadFormat::kSparse: {
      const SparseEntries e = decode_sparse(payload, n);
      out.insert(out.end(), e.idx.begin(), e.idx.end());
      return;
    }
    case PayloadFormat::kSbc: {
      const SbcEntries e = decode_sbc(payload, n);
      out.insert(out.end(), e.idx.begin(), e.idx.end());
      for (const NonFinite& x : e.non_finite) out.push_back(x.idx);
      return;
    }
    default:
      CC_THROW(kMalformedPayload, "payload format ", int(payload[3]),
               " has no list of indices");
  }
}

size_t max_payload_bytes(uint64_t n) {
  // Beyond this the per-element arithmetic below could overflow; no tensor
  // compcoll compresses comes near (indices are u32).
  constexpr uint64_t kLargest = std::numeric_limits<size_t>::max() / 64;
  if (n > kLargest) return std::numeric_limits<size_t>::max();
  const size_t count = static_cast<size_t>(n);
  // The widest sparse encodings: fp32 values with 5-byte varints, or with
  // Rice codes of any parameter (a stop bit and up to 31 low bits each, the
  // quotients summing to at most n).
  const size_t sparse =
      std::max(sparse_payload_max_bytes(count, count, {ValueType::kFp32, IndexType::kVarintGap}),
               kPayloadHeaderBytes + 4 * count + 1 + (33 * count + 7) / 8);
  // Rice codes: each position costs its quotient in unary (the quotients sum
  // to at most n >> b), a stop bit and b remainder bits; b <= 31.
  const size_t rice_bits = count + count * 32;
  // Both sides: two means and a sign bit per position.
  const size_t sbc = kPayloadHeaderBytes + 2 * sizeof(float) + non_finite_bytes(count) +
                     (count + 7) / 8 + (rice_bits + 63) / 64 * 8;
  const OneBitConfig smallest_blocks{.block = 8, .scale = ScaleMode::kSignedMeans};
  const size_t onebit = onebit_payload_bytes(count, smallest_blocks) + 8 * count;
  return std::max({sparse, sbc, onebit});
}

}  // namespace compcoll
