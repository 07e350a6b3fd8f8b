// The allgather pattern of the sparse allreduce (dgc, sbc, sdagc).
//
// Each rank encodes its gradient into a sparse payload (its codec updates the
// residual), allgathers the payloads (zeroing its buffer while they travel:
// Comm::allgatherv_overlapping), and every rank decodes all of them in
// rank order into the zeroed buffer: the same additions in the same order on
// every rank, hence bitwise-identical results. Nothing is lost: what the
// codec did not send stays in its residual (sent + residual = accumulated).
// Cost per rank: its payload to P-1 peers, so the volume grows with P; the
// scatter pattern (sparse_scatter.h) does not.
#pragma once

#include <cstddef>
#include <exception>

#include "collectives/algorithm.h"

namespace compcoll {

// In-place allreduce of n float32 through codec (SUM, or AVG when average).
// With list_support, the CallInfo lists the indices of every payload it
// decoded (Algorithm::allreduce_listing_support). addends: added to buf
// before it is encoded (Algorithm::allreduce_host_sum).
CallInfo sparse_allgather(Comm& comm, const char* name, const SparseCodec& codec, float* buf,
                          size_t n, bool average, CodecState& state, bool list_support = false,
                          const Addends& addends = {});

// Rethrows a decoder's error as kMalformedPayload naming the algorithm, this
// rank and the peer whose payload it was. Shared by both patterns.
[[noreturn]] void reject_peer_payload(const char* name, const Comm& comm, int peer,
                                      const std::exception& e);

}  // namespace compcoll
