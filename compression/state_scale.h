// Rescaling an error-feedback state when the unit of its gradients changes,
// and undoing a call whose result the caller will discard.
//
// Mixed-precision training multiplies the loss, and so every gradient a
// compressed allreduce sees, by a loss scale S (torch.amp.GradScaler), and
// divides the reduced result by S before the optimizer steps. The state
// holds gradients in the unit of the scale they were made at: a residual
// made at S and sent after the scale has become S/2 would be unscaled by
// S/2 and step twice as far as it should. GradScaler halves S at every step
// whose gradients overflow (and skips that step) and doubles it after a run
// of good ones; at the start of training it halves several times in a row,
// and without rescaling, what the first steps left in the residual came
// back up to 2^k times too large (the DDP + GradScaler test in
// tests/python/test_loss_scale.py diverged this way under dgc, sbc and sdagc).
#pragma once

#include "compcoll/types.h"
#include "compression/codec.h"

namespace compcoll {

// Multiplies every gradient-valued field by `factor` (new scale / old
// scale): v, u and handed by factor, second_moment (a mean of squared
// gradients) by factor^2. Counts, lambda (sdagc's threshold, in units of
// sigma) and regions are unit-free and stay. A device-resident state is
// brought to host memory first. factor must be finite and > 0.
void rescale_codec_state(CodecState& state, float factor);

// A copy of a host state's contents (v, u, handed, second_moment, steps,
// lambda, regions), and the way back: a call whose result a loss scaler will
// throw away (Communicator::set_discard_nonfinite) is undone with them.
//
// Taken before every such call, so it must cost a copy and nothing more:
// `into` is a buffer the caller keeps from call to call, and the copy reuses
// its vectors' capacity (a fresh allocation per call page-faults the whole
// state in again; it made a 4M-float dgc call 35 % slower where the reused
// buffer makes it about 10 %). The restore swaps the contents, so the undone
// state's memory becomes the next call's buffer. snapshot_codec_state
// returns false, and copies nothing, for a device-resident state (its
// contents are not in host memory).
bool snapshot_codec_state(const CodecState& state, CodecState& into);
void restore_codec_state(CodecState& state, CodecState& snapshot);

// Whether every one of n elements of dtype (float32, float16, bfloat16) at
// data is finite: by the exponent bits, without converting.
bool all_finite(const void* data, size_t n, DType dtype);

}  // namespace compcoll
