// 8-bit floating-point values for sparse payloads: IEEE-style E4M3 (sign,
// 4 exponent bits with bias 7, 3 mantissa bits; exponent 15 is Inf/NaN, so
// the largest finite magnitude is 240) behind one power-of-two scale per
// payload.
//
// Why a scale: the k entries a sparsifier sends span a narrow range of
// magnitudes (everything above its threshold, rarely more than 2^10 apart),
// but where that range sits depends on the layer and the step. The scale
// 2^s puts the payload's largest finite magnitude at or just under 240, so
// the 14 binades E4M3 covers are the ones the payload uses. A power of two
// keeps the scaling exact: a value decodes to code_value(c) * 2^s with no
// rounding, and re-encoding a subset of decoded values (the scatter
// pattern's parts) with its own, never larger, scale is exact too.
//
// What one code cannot hold (the 3-bit mantissa's rounding, a magnitude
// under the smallest subnormal) is the sender's to keep: the encoder hands
// back what receivers decode, and the codecs keep the difference in their
// residual, as with fp16. Inf and NaN travel as such.
#pragma once

#include <cstdint>
#include <span>

namespace compcoll {

// Largest finite E4M3 magnitude, and the range of a payload's scale
// exponent. Below -140 a decoded subnormal code could fall under float's
// own smallest subnormal (2^-149) and round; above 121 every finite float
// fits under 240 * 2^s anyway.
constexpr float kFp8Max = 240.0f;
constexpr int kFp8MinScale = -140;
constexpr int kFp8MaxScale = 121;

// The smallest s in [kFp8MinScale, kFp8MaxScale] with max_abs <= 240 * 2^s
// (max_abs finite and >= 0; 0 gives kFp8MinScale).
int fp8_scale_for(float max_abs);

// Rounds value * 2^-scale to the nearest code (ties to even). Finite values
// beyond the largest finite code are clamped to it (never sent as Inf); Inf
// and NaN map to E4M3's Inf and NaN.
uint8_t float_to_fp8(float value, int scale);

// code's value times 2^scale, exactly (for scale in the range above).
float fp8_to_float(uint8_t code, int scale);

// float_to_fp8 over a payload's values: codes[i] gets each value's code and
// values[i] what receivers decode from it (the sender keeps the difference).
void fp8_encode(std::span<float> values, int scale, uint8_t* codes);

}  // namespace compcoll
