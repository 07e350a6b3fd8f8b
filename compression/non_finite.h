// Non-finite values (NaN, +-Inf) cannot ride in a lossy representation (a
// sign bit and a scale, or a binarised mean) without spreading to their
// neighbours or poisoning the sender's residual. sbc and onebit send them
// apart, exactly, as a list after the payload's fixed fields:
//
//   u32 count, then count x (u32 index, f32 value), indices increasing.
//
// The receiver writes them exactly where a dense sum would have them; the
// sender's error-feedback memory restarts from zero there.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compcoll/types.h"

namespace compcoll {

struct NonFinite {
  uint32_t idx;
  float value;
};

size_t non_finite_bytes(size_t count);
void append_non_finite(Bytes& out, const std::vector<NonFinite>& list);

// Parses the list at payload[offset...]; throws kMalformedPayload when it
// is truncated, indices are not increasing or reach n, or a value is
// finite. Returns the offset just past it.
size_t parse_non_finite(std::span<const uint8_t> payload, size_t offset, uint64_t n,
                        std::vector<NonFinite>& out);

}  // namespace compcoll
