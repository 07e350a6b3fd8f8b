// The element-wise heart of error feedback, shared by the codecs' fused loops.
//
//   g  this step's gradient (times the local clipping scale)
//   u  momentum-corrected velocity (DGC's momentum correction)
//   v  accumulated, not-yet-sent gradient (the residual)
//
// kNone:     v += g
// kPlain:    u = m*u + g;      v += u
// kNesterov: u = (u + g) * m;  v += u + g
#pragma once

#include <cmath>
#include <cstddef>

#include "compression/simd.h"

namespace compcoll {

enum class MomentumMode { kNone, kPlain, kNesterov };

inline MomentumMode momentum_mode(float momentum, bool nesterov) {
  if (momentum == 0.0f) return MomentumMode::kNone;
  return nesterov ? MomentumMode::kNesterov : MomentumMode::kPlain;
}

// Updates u in place and returns the increment for v.
template <MomentumMode M>
inline float momentum_step(float g, float& u, float m) {
  if constexpr (M == MomentumMode::kNone) {
    return g;
  } else if constexpr (M == MomentumMode::kPlain) {
    u = m * u + g;
    return u;
  } else {
    u = (u + g) * m;
    return u + g;
  }
}

// One vector of momentum_step at element i: loads and stores u[i..i+4)
// when momentum is on (u may be null when it is off).
template <MomentumMode M>
inline simd::f32x4 momentum_step4(simd::f32x4 g, float* u_base, size_t i, simd::f32x4 m) {
  if constexpr (M == MomentumMode::kNone) {
    return g;
  } else {
    float* u = u_base + i;
    simd::f32x4 ui = simd::load(u);
    simd::f32x4 inc;
    if constexpr (M == MomentumMode::kPlain) {
      ui = m * ui + g;
      inc = ui;
    } else {
      ui = (ui + g) * m;
      inc = ui + g;
    }
    simd::store(u, ui);
    return inc;
  }
}

// The increment momentum_step would return, without updating u (sampling).
template <MomentumMode M>
inline float momentum_peek(float g, float u, float m) {
  return momentum_step<M>(g, u, m);
}

// Calls fn(mode-constant) with M bound to the runtime mode.
template <typename Fn>
inline auto dispatch_momentum(MomentumMode mode, Fn&& fn) {
  switch (mode) {
    case MomentumMode::kPlain:
      return fn(std::integral_constant<MomentumMode, MomentumMode::kPlain>{});
    case MomentumMode::kNesterov:
      return fn(std::integral_constant<MomentumMode, MomentumMode::kNesterov>{});
    default:
      return fn(std::integral_constant<MomentumMode, MomentumMode::kNone>{});
  }
}

// L2 norm of g (double accumulation in eight lanes so it vectorises).
double l2_norm(const float* g, size_t n);

// L2 norm of g's finite elements (non-finite ones left out).
double finite_l2_norm(const float* g, size_t n);

// DGC's local gradient clipping: the factor that brings ||g|| down to
// clip / sqrt(world_size), or 1 when clipping is off or not needed. The
// norm is that of the finite elements: a NaN or Inf (which reaches the
// output as it is, never the residual) does not turn clipping off for the
// rest of the tensor.
float clip_scale(const float* g, size_t n, float clip, int world_size);

}  // namespace compcoll
