// A part refused by its owner, told to every rank.
//
// In the scatter pattern (sparse_scatter.h) and onebit (onebit_allreduce.h)
// rank j receives the parts of shard j alone, in an alltoallv, then every
// rank gathers every owner's result. A part that owner j refuses (malformed,
// from a faulty or hostile peer) is seen by j alone: if j simply threw, the
// others would wait in the gather until the timeout, and then blame j for
// not arriving. So j still takes part in the gather, sending this marker in
// place of its result; every rank finds it there and stops with the same
// error, naming the sender and the owner.
//
// Marker: 8 bytes 0xff (no result starts so: a payload starts with its
// magic, a scatter result with a demand that is at most ranks x elements),
// then the refused sender's rank as u32. 12 bytes: below every gather's
// bound (a payload header alone is 16).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "collectives/comm.h"

namespace compcoll {

constexpr size_t kRejectionBytes = 12;

Bytes rejection_marker(int sender);

// The sender a marker names, or nullopt when `part` is not a marker.
std::optional<int> rejected_sender(std::span<const uint8_t> part);

// Throws kMalformedPayload on a rank whose gather holds owner's marker for
// sender's part ("`name` allreduce on rank R: rank O refused the part rank
// S sent it ...").
[[noreturn]] void throw_owner_rejection(const char* name, const Comm& comm, int owner, int sender);

}  // namespace compcoll
