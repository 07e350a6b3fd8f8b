// Format-driven decoding: a receiver needs only the payload and the tensor
// size, not the sender's codec configuration.
#pragma once

#include <cstdint>
#include <span>

namespace compcoll {

// out[0..n) += the dense contribution of a sparse (dgc, sdagc) or sbc
// payload. Throws kMalformedPayload (leaving out untouched) on bad input.
void decode_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n);

}  // namespace compcoll
