// 1-bit quantization with error feedback (Seide et al. 2014; DeepSpeed's
// compressed allreduce), one rank's side of it.
//
// quantize with feedback:  e = x + err;  send Q(e);  err = e - D(Q(e))
// Q(e) is one sign bit per element plus per-block scales (block = B
// elements). Reconstruction D:
//   kMeanMagnitude: every element of the block becomes +-mean(|e|)
//   kSignedMeans:   Seide's pair: mean of the non-negative entries for a 0
//                   bit, minus the mean magnitude of the negative ones for a 1
// The same function serves the worker (x = gradient shard, err = worker
// error) and the server (x = sum of the shard, err = server error); both
// errors persist across steps.
//
// Bounded residual (residual_bound r > 0, the default): after quantizing,
// each element's error is clamped to +-r x the block's larger reconstruction
// magnitude. Why: D sends at most that magnitude per element per step, so an
// element whose gradient stays above it (a bias or classifier weight in a
// block of thousands of small weights: several times the block's scale, up
// to 50x its mean, in the convergence suite's CNN) gains residual every step
// without limit (integrator wind-up) and is paid out many steps after its
// gradient turned;
// an optimizer's momentum amplifies that into oscillation, and training
// stalled at chance (docs/convergence.md). The bound drops the excess, as
// signSGD drops magnitude (r >= 1 would keep every residual of an element
// below the scale; the default 0.5 trained best in the suite, 1 second).
// r = 0: unbounded, nothing is ever dropped.
//
// Payload: header (aux0 = ScaleMode, aux1 = log2 B, n elements, k blocks),
// k or 2k fp32 scales, ceil(n/8) bytes of sign bits (LSB first, 1 for a
// negative element), then the non-finite list (non_finite.h): NaN and Inf
// are sent exactly and kept out of the scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "compcoll/types.h"

namespace compcoll {

enum class ScaleMode : uint8_t { kMeanMagnitude = 0, kSignedMeans = 1 };

struct OneBitConfig {
  size_t block = 2048;  // elements per scale; a power of two, >= 8
  ScaleMode scale = ScaleMode::kMeanMagnitude;
  float residual_bound = 0.5f;  // |err| <= this x the block's scale; 0 = unbounded
};

void validate_onebit_config(const OneBitConfig& c);
// Size of a payload without non-finite values (each adds 8 bytes).
size_t onebit_payload_bytes(size_t n, const OneBitConfig& c);

// e = x + err; out = Q(e) (overwritten); err = e - D(Q(e)), bounded as above.
// x and err hold n floats; err may alias nothing else.
void onebit_encode(const OneBitConfig& c, const float* x, float* err, size_t n, Bytes& out);

// out = D(payload) (or out += when accumulate). Validates the whole payload
// (n, block size, exact length) before writing.
void onebit_decode(std::span<const uint8_t> payload, float* out, size_t n, bool accumulate);

}  // namespace compcoll
