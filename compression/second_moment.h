// Normalized selection (COMPCOLL_SELECTION=normalized; auto under Adam): rank
// the residual's elements by |v_i| / sqrt(s_i), not by |v_i|.
//
// Why: under Adam an element moves by about the learning rate whatever its
// gradient's scale, so what a residual entry is worth is how many of Adam's
// steps it holds, v_i / sqrt(E[g_i^2]). Ranked by |v_i|, the elements with
// small gradients (whole layers of them) are almost never sent and are
// starved; ranked by the normalized value, every element is sent when it
// has gathered about as many steps' worth as the others. The default under
// Adam (COMPCOLL_SELECTION=auto), together with momentum factor masking at
// every step: on the convergence suite's language model that took dgc from
// +1.9 % (masked, by magnitude) to +1.0 % of dense's loss at 1000 steps over
// six seeds; with masking only after the warm-up it had been level with
// magnitude (+2.84 % against +2.70 %). It costs 1.7x (dgc) to 3.3x (sdagc)
// the encode time (docs/convergence.md, "Masking under Adam").
//
// s_i is an exponential moving average of the element's squared gradient
// (after local clipping, before the momentum correction), as Adam keeps one
// of the averaged gradient. It is local to the rank (each rank ranks its own
// residual), kept in CodecState::second_moment, and never travels. What is
// sent is v_i itself; the optimizer normalizes it. Non-finite gradients do
// not enter s (they reach v and are sent as they are), and s saturates at
// the largest float, so s stays finite.
#pragma once

#include <cstddef>
#include <memory>

#include "compression/accumulate.h"
#include "compression/codec.h"

namespace compcoll {

// One pass over n elements: the momentum correction and v's accumulation
// (as the codecs' fused loops do them), s = beta*s + (1-beta)*g^2, and
// view_i = v_i / sqrt(s_i + tiny), the key the selection ranks, returned as
// a new n-element array (never zero-filled: the pass writes every element).
// Makes st.second_moment on first use. g is scaled by `scale` (local
// clipping).
std::unique_ptr<float[]> accumulate_normalized(MomentumMode mode, const float* g, float scale,
                                               float m, CodecState& st, float beta, size_t n);

}  // namespace compcoll
