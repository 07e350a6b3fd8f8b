// The Comm seam: the only thing collectives/ knows about communication.
//
// Implementations live in transport/ (Gloo tcp/ibverbs, NCCL) and in the
// PyTorch backend (delegating to an inner process group). Every call is
// collective: all ranks call it in the same order. Every call honours the
// communicator's timeout and throws compcoll::Error(kTransport) when a peer
// fails or the timeout expires; after such an error the Comm is broken and
// every further call throws, saying it must be rebuilt.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "compcoll/types.h"

namespace compcoll {

// Payloads of all ranks, concatenated in rank order.
struct Gathered {
  Bytes data;
  std::vector<size_t> offsets;  // size()+1 entries; part r is [offsets[r], offsets[r+1])

  std::span<const uint8_t> part(int r) const {
    return {data.data() + offsets[r], offsets[r + 1] - offsets[r]};
  }
  int parts() const { return static_cast<int>(offsets.size()) - 1; }
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Every rank contributes a payload of 0 to max_part bytes and receives all
  // payloads in rank order.
  //
  // max_part is what the caller knows about the call: the largest payload
  // any rank may legitimately send (collectives derive it from the tensor
  // size, see max_payload_bytes in compression/payload.h). A peer announcing
  // more is refused right after the size round, before anything is
  // allocated for it: a hostile or corrupted peer cannot make this rank
  // commit memory beyond what the call could need. The refusal is a
  // kTransport error that breaks the communicator (the ranks disagree on
  // what follows). Sending more than max_part is a caller bug (kInternal).
  virtual Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) = 0;

  // allgatherv(), calling meanwhile() on this thread while the payloads are
  // in flight: the sparse allreduce zeroes its output there instead of after
  // the exchange. meanwhile must not touch send. Where the transport cannot
  // overlap (the default), it runs first. An exception from meanwhile is
  // rethrown once the exchange is complete, so the ranks stay in step.
  virtual Gathered allgatherv_overlapping(std::span<const uint8_t> send, size_t max_part,
                                          const std::function<void()>& meanwhile) {
    meanwhile();
    return allgatherv(send, max_part);
  }

  // send[j] goes to rank j (send.size() == size()); returns what each rank
  // sent to this one, in rank order. Entry rank() is passed through locally.
  // max_part bounds every part as in allgatherv.
  virtual std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) = 0;

  // Exact in-place reduction. op is kSum, kMin, kMax or kProd; kAvg is the
  // collectives' job (sum, then divide) and implementations may reject it.
  virtual void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;

  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Bytes this rank has put on the wire through this communicator so far
  // (payloads and size headers; a ring allreduce counts what the ring
  // sends). Stats and the benchmark report differences of it.
  virtual uint64_t bytes_sent() const { return 0; }

  // A communicator of `members` only (world ranks, ascending, this rank
  // among them; its rank is the index in members), connected directly
  // between them: the other ranks take no part in its calls. Only members
  // call it, all with the same `name`, unique within this communicator.
  // What it sends also counts in this Comm's bytes_sent(). Null when the
  // transport cannot (can_connect_subgroup() is false): the caller then
  // builds the group on this Comm's own calls (collectives/leader_comm.h).
  virtual bool can_connect_subgroup() const { return false; }
  virtual std::unique_ptr<Comm> connect_subgroup(const std::vector<int>& members,
                                                 const std::string& name) {
    (void)members;
    (void)name;
    return nullptr;
  }
};

// max_part for callers that know nothing about the payloads (tests, tools).
inline constexpr size_t kUnboundedPart = std::numeric_limits<size_t>::max();

// The message every implementation gives when a peer announces a part above
// max_part (one wording, so logs and tests can rely on it). Inline: the
// transports use the seam without linking the collectives.
inline std::string oversized_part_message(int peer, uint64_t announced, size_t max_part) {
  return detail::concat("rank ", peer, " announced a ", announced,
                        "-byte payload, more than the ", max_part,
                        " bytes any payload of this call can have; refused before allocating");
}

// Throws kInternal when this rank's own part exceeds max_part.
inline void check_own_part(size_t bytes, size_t max_part, const char* what) {
  CC_CHECK_LE(bytes, max_part, kInternal, what, ": this rank's own payload of ", bytes,
              " bytes exceeds the call's bound of ", max_part, " bytes");
}

// Collective over `comm`: every rank contributes one string of 1 to
// max_bytes bytes (`what` names it in the error: an empty or longer one is
// kInvalidArgument here, before any traffic, and the bound refuses a peer's
// longer one) and gets all of them in rank order. For the small reports
// exchanged once at creation (host ids, machine loads).
inline std::vector<std::string> gather_strings(Comm& comm, const std::string& mine,
                                               size_t max_bytes, const char* what) {
  CC_CHECK(!mine.empty() && mine.size() <= max_bytes, kInvalidArgument, "rank ", comm.rank(),
           ": the ", what, " must have 1 to ", max_bytes, " bytes, got ", mine.size());
  const Gathered all =
      comm.allgatherv({reinterpret_cast<const uint8_t*>(mine.data()), mine.size()}, max_bytes);
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(all.parts()));
  for (int r = 0; r < all.parts(); ++r) {
    const auto p = all.part(r);
    out.emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
  }
  return out;
}

}  // namespace compcoll
