// The wire format shared by every codec: a 16-byte versioned header followed
// by a codec-specific body. All integers are little-endian.
//
//   offset size field
//   0      2    magic 0xCC0C
//   2      1    version (kPayloadVersion)
//   3      1    format  (PayloadFormat)
//   4      1    aux0    (sparse: ValueType; sbc: Golomb-Rice parameter b;
//                        onebit: ScaleMode)
//   5      1    aux1    (sparse: IndexType; sbc: 1 when the negative side was
//                        sent; onebit: log2 of the block size)
//   6      2    reserved, must be 0
//   8      4    n: dense element count the payload describes
//   12     4    k: entries (sparse, sbc) or blocks (onebit)
//
// n and k are 32 bits (version 2; version 1 spent 8 bytes on each): every
// body already indexes elements with 32 bits (sparse indices, the
// non-finite list), so a tensor of 2^32 elements or more could never be
// encoded, and at the ratios compcoll reaches the header is a visible part of
// a small bucket's payload (8 of 157 bytes for sbc on a 78,000-element
// bucket). write_header refuses n or k that do not fit, naming them.
//
// Readers validate everything against what the caller expects (n) and the
// bytes actually present, and throw ErrorKind::kMalformedPayload otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>

#include "compcoll/error.h"
#include "compcoll/types.h"

namespace compcoll {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "compcoll's wire format is little-endian; add byte swaps for this target");

constexpr uint16_t kPayloadMagic = 0xCC0C;
constexpr uint8_t kPayloadVersion = 2;
constexpr size_t kPayloadHeaderBytes = 16;
// The largest n (and k) a header can carry.
constexpr uint64_t kMaxPayloadElements = 0xFFFFFFFFull;

enum class PayloadFormat : uint8_t {
  kSparse = 1,  // dgc, sdagc: indices and values
  kSbc = 2,     // positions (Golomb-Rice gaps) and one mean
  kOneBit = 3,  // per-block scales and sign bits
};

// How sparse values travel. fp32 is exact; fp16/bf16 halve the value bytes,
// fp8 (E4M3 behind a power-of-two scale per payload, compression/fp8.h)
// quarters them; the rounding error stays in the sender's residual.
enum class ValueType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2, kFp8 = 3 };
constexpr ValueType kLastValueType = ValueType::kFp8;
// How sparse indices travel: raw u32, LEB128 varints of the gaps between
// sorted indices (about 2 bytes per entry at density 0.001), or the gaps'
// Golomb-Rice codes (one parameter byte, then about log2(1/density) + 2 bits
// per entry: 1.2-1.5 bytes at densities 0.001-0.004).
enum class IndexType : uint8_t { kU32 = 0, kVarintGap = 1, kRiceGap = 2 };
constexpr IndexType kLastIndexType = IndexType::kRiceGap;

const char* payload_format_name(PayloadFormat f);
const char* value_type_name(ValueType v);
const char* index_type_name(IndexType i);
// The inverse of value_type_name / index_type_name; nullopt for a name that
// is none of them (the caller words the error: a flag, a variable).
std::optional<ValueType> value_type_from_name(std::string_view name);
std::optional<IndexType> index_type_from_name(std::string_view name);
// Bytes per value (fp8: 1; its payload adds a 2-byte scale exponent once).
size_t value_type_size(ValueType v);

struct PayloadHeader {
  PayloadFormat format;
  uint8_t aux0 = 0;
  uint8_t aux1 = 0;
  uint64_t n = 0;
  uint64_t k = 0;
};

// Writes the header into the first kPayloadHeaderBytes of out. Throws
// kInvalidArgument when n or k exceeds kMaxPayloadElements.
void write_header(const PayloadHeader& h, uint8_t* out);

// Parses and checks magic, version, reserved bits, the format and n against
// expected_n. Throws kMalformedPayload naming what is wrong.
PayloadHeader read_header(std::span<const uint8_t> payload, PayloadFormat expected_format,
                          uint64_t expected_n);

// Peeks at the format byte after validating magic and version.
PayloadFormat peek_format(std::span<const uint8_t> payload);

// Little-endian scalar store/load helpers for bodies.
template <typename T>
inline void store_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
inline T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace compcoll

#define CC_PAYLOAD_CHECK(cond, ...) CC_CHECK(cond, kMalformedPayload, __VA_ARGS__)
