// Merging two error-feedback states of one logical tensor.
//
// The PyTorch backend keys states by buffer (integration/pytorch/csrc/
// buffer_slots.h). A program that reduces a new tensor every call while the
// previous one is still alive splits one tensor's history between two
// states, each seeing every other call. Once that is recognised, the two are
// merged into one so that nothing either holds is lost.
#pragma once

#include "compression/codec.h"

namespace compcoll {

// Merges `older` (the state that stopped being used) into `newer` (the one
// that goes on). Both must have the same element count (false, and nothing
// changed, otherwise). What each field becomes, and why:
//   v (residual)     the sum: what either has not sent is sent later, so the
//                    invariant "sent + residual = accumulated" holds for the
//                    merged history;
//   u (velocity)     the mean: each is a momentum over every other call,
//                    and for a steady gradient g each has reached the
//                    g / (1 - m) a single state would hold (a sum would
//                    double it);
//   steps            the sum: the warm-up counts the tensor's calls;
//   handed, second_moment, lambda, regions
//                    newer's, the more recent estimate; older's where newer
//                    has none.
bool merge_codec_state(CodecState& older, CodecState& newer);

}  // namespace compcoll
