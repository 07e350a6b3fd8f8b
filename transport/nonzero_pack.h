// Packing a float32 buffer as its nonzero words, for the host hierarchy's
// broadcast (transport/shm_group.cc).
//
// After the leaders' compressed allreduce most of a host's result is zero:
// dgc/sdagc/sbc deliver about k entries per host, csc a few chunks. Copying
// the dense result through shared memory costs the leader and every other
// local rank a full pass over the tensor each, and with more ranks than
// cores those passes are the largest part of the hierarchy's local cost.
// Instead the leader writes (index, bits) pairs, and the others zero their
// buffer and scatter: a memset is cheaper than a copy, and the leader's scan
// only reads.
//
// "Nonzero" is by bits, not by value: -0.0 is sent, so the receivers end up
// with exactly the leader's bits (every rank the same bits, as DESIGN.md
// requires), NaN and infinities included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace compcoll {

// Writes (index, bits) pairs of src[0, len)'s nonzero words into out,
// 2 * cap uint32 of room, in ascending index order. Returns the number of
// pairs, or kNotSparse when there are more than cap (out then holds garbage).
// Indices are uint32: len must be < 2^32 (a shared-memory round is).
inline constexpr size_t kNotSparse = ~size_t{0};
size_t pack_nonzeros(const float* src, size_t len, uint32_t* out, size_t cap);

// As pack_nonzeros for the round src[off, off + len), reading only the words
// that `listed` names (indices into src; those outside the round are
// skipped, repeats give repeated pairs): the caller vouches that every other
// word of the round is zero (CallInfo::support), so the leader never scans
// the tensor. Pairs are in the list's order; their indices are relative to
// off.
size_t pack_listed(const float* src, size_t off, size_t len, std::span<const uint32_t> listed,
                   uint32_t* out, size_t cap);

// dst[0, len) = 0 with the packed pairs' bits at their indices. The pairs
// come from this host's leader through shared memory; an index outside
// [0, len) is a corrupted segment and throws kInternal instead of writing
// out of bounds.
void unpack_nonzeros(const uint32_t* pairs, size_t count, float* dst, size_t len);

}  // namespace compcoll
