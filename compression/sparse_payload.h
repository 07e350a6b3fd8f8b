// Sparse payloads (dgc, sdagc): header, then k values, then k indices.
//
// Values come first because they have a fixed size per entry (fp8: after
// one int16 scale exponent); the index section may be gap-coded (varint, or
// Golomb-Rice after one parameter byte) and so has a data-dependent length,
// which is simply "the rest of the payload".
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compcoll/types.h"
#include "compression/payload.h"

namespace compcoll {

struct SparseEncoding {
  ValueType values = ValueType::kFp32;
  IndexType indices = IndexType::kU32;
};

// Encodes (idx[i], values[i]) for a tensor of n elements into out
// (overwritten). idx must be strictly increasing and < n. On return values[i]
// holds exactly what a receiver decodes (after fp16/bf16/fp8 rounding), so the
// caller can keep the rounding error in its residual.
void encode_sparse(std::span<const uint32_t> idx, std::span<float> values, uint64_t n,
                   SparseEncoding enc, Bytes& out);

// Upper bound of encode_sparse's output size for k entries of a tensor of n.
size_t sparse_payload_max_bytes(size_t k, uint64_t n, SparseEncoding enc);

// out[idx] += value for every entry. The whole payload is validated before the
// first write: a malformed payload throws kMalformedPayload and leaves out
// untouched.
void decode_sparse_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n);

// Decodes into index/value lists (tests, tools).
struct SparseEntries {
  std::vector<uint32_t> idx;
  std::vector<float> values;
};
SparseEntries decode_sparse(std::span<const uint8_t> payload, uint64_t n);

}  // namespace compcoll
