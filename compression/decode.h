// Format-driven decoding: a receiver needs only the payload and the tensor
// size, not the sender's codec configuration.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace compcoll {

// out[0..n) += the dense contribution of a sparse (dgc, sdagc) or sbc
// payload. Throws kMalformedPayload (leaving out untouched) on bad input.
void decode_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n);

// Appends to out every index that decode_accumulate() of the same payload
// writes (a sparse payload's indices; an sbc payload's positions and its
// non-finite entries). Throws kMalformedPayload on bad input.
void append_payload_indices(std::span<const uint8_t> payload, uint64_t n,
                            std::vector<uint32_t>& out);

// The largest payload any compcoll encoder produces for a tensor (or a
// onebit shard) of n elements, whatever its configuration and input: the
// largest of
//   sparse  every element selected, fp32 values and 5-byte varint gaps
//   sbc     every element selected and non-finite, Rice parameter 31
//   onebit  8-element blocks with two scales, every element non-finite.
// About 16.1 bytes per element plus a few dozen; the transports refuse a
// peer announcing more (the Comm seam's max_part), so a hostile peer cannot
// make a rank allocate more than a small multiple of the tensor.
size_t max_payload_bytes(uint64_t n);

}  // namespace compcoll
