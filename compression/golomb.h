// Golomb-Rice coding of position gaps (Sparse Binary Compression).
//
// Sorted positions p_0 < p_1 < ... are turned into gaps g_i = p_i - p_{i-1} - 1
// (p_{-1} = -1, so gaps start at 0). Each gap is written as q = g >> b in
// unary (q one-bits, then a zero-bit) followed by the low b bits of g.
// For positions drawn at density d, gaps are geometric and the optimal
// parameter is b* = 1 + floor(log2(log(phi - 1) / log(1 - d))), phi the
// golden ratio; about b* + 2 bits per position (11.5 at d = 0.001).
// Bits are packed LSB-first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compcoll/types.h"

namespace compcoll {

// b* for density d in (0, 1], clamped to [0, 31].
int golomb_rice_parameter(double density);

// Appends the Rice code of the gaps of idx (strictly increasing) to out.
// Returns the number of bits written (the last byte is zero-padded).
size_t rice_encode_positions(std::span<const uint32_t> idx, int b, Bytes& out);

// Decodes exactly k positions, each < n, from bits; throws kMalformedPayload
// when the stream is truncated, a position runs past n, or more than 7
// padding bits (or any non-zero padding) follow the last code.
std::vector<uint32_t> rice_decode_positions(std::span<const uint8_t> bits, uint64_t k, int b,
                                            uint64_t n);

}  // namespace compcoll
