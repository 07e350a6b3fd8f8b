// GlooComm: the Comm seam over Gloo's tcp device and its UnboundBuffer API.
//
// Terms used below:
//   call      one collective (allgatherv, alltoallv, allreduce, broadcast,
//             barrier). Every call takes the next tag from a per-communicator
//             counter, so messages of successive calls never share a Gloo slot
//             even when a fast rank runs ahead into the next call.
//   deadline  each call must finish within timeout() of its start; every wait
//             inside it is given the time left to that deadline.
//   broken    after the first transport failure (dead peer, reset socket,
//             timeout) the communicator refuses all further calls with
//             ErrorKind::kTransport: Gloo's pairs are poisoned at that point,
//             and ranks may disagree about which calls completed, so the only
//             safe recovery is a new communicator.
//
// Argument errors (bad root, kAvg, wrong alltoallv arity) are detected before
// any traffic, throw kInvalidArgument and leave the communicator usable.
//
// A GlooComm is used by one thread at a time, like a Gloo context.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/comm.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace compcoll {

// The bytes gloo::allreduce's ring sends from `rank` of `size` for a buffer
// of `total` bytes of `elem`-byte elements (GlooComm::allreduce counts them;
// the benchmark compares with them).
uint64_t gloo_ring_bytes_sent(int rank, int size, size_t total, size_t elem);

class GlooComm : public Comm {
 public:
  // context: a fully connected Gloo context (connectFullMesh done).
  // timeout: end-to-end limit of every call.
  // peer_addresses: for rank i, the address strings Gloo may print for the
  //   connection to rank i (see peer_addresses.h; empty when unknown); used
  //   to name the peer rank when a Gloo error message only has an address.
  GlooComm(std::shared_ptr<gloo::Context> context,
           std::chrono::milliseconds timeout,
           std::vector<std::vector<std::string>> peer_addresses = {});
  ~GlooComm() override;

  GlooComm(const GlooComm&) = delete;
  GlooComm& operator=(const GlooComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override;
  // meanwhile runs once this rank's first round is posted (gloo_comm.cc).
  Gathered allgatherv_overlapping(std::span<const uint8_t> send, size_t max_part,
                                  const std::function<void()>& meanwhile) override;
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

  // Payload bytes this rank has handed to its sockets: size headers and
  // payloads of the point-to-point calls, and for allreduce exactly what
  // Gloo's ring sends (2*N - the two chunks this rank never forwards, so
  // the sum over ranks is 2*(P-1)*N). Gloo's own 48-byte message preambles
  // are not counted.
  // Subgroups' bytes are included (see connect_subgroup).
  uint64_t bytes_sent() const override { return bytes_sent_ + *subgroups_sent_; }

  // Subgroups: a new Gloo context between the members, through the same
  // rendezvous store (connect_gloo installs the connector; a GlooComm built
  // without one cannot).
  using SubgroupConnector = std::function<std::unique_ptr<GlooComm>(
      const std::vector<int>& members, const std::string& name)>;
  void set_subgroup_connector(SubgroupConnector c) { subgroup_connector_ = std::move(c); }
  bool can_connect_subgroup() const override { return static_cast<bool>(subgroup_connector_); }
  std::unique_ptr<Comm> connect_subgroup(const std::vector<int>& members,
                                         const std::string& name) override;

  // True after a transport error; every further call throws kTransport.
  bool broken() const { return broken_; }
  const std::string& broken_reason() const { return broken_reason_; }

  // The underlying Gloo context, for callers that run Gloo's own algorithms
  // next to compcoll's (the benchmark's dense baseline). Such callers take
  // their tag from reserve_tag() so their slots never meet ours.
  const std::shared_ptr<gloo::Context>& gloo_context() const { return context_; }
  uint32_t reserve_tag() { return next_tag_++; }

  // "rank R/N" prefix used in every message.
  std::string who() const;

 private:
  friend class CallScope;

  // Throws kTransport when broken.
  void check_usable(const char* op) const;
  // Builds the kTransport error for a failed call, marks the communicator
  // broken, tears the connections down so that peers notice at once, and
  // throws; a TimeoutError carrying timeout() when the call's deadline is
  // what failed it.
  [[noreturn]] void fail(const std::string& what, bool timed_out = false);
  // Appends " (rank i is ADDR)" for every peer address found in msg.
  std::string name_peers(const std::string& msg) const;

  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::vector<std::string>> peer_addresses_;
  uint32_t next_tag_ = 1;
  // The eager bounds (gloo_comm.cc), 0 before the first call: allgatherv's
  // is the same on every rank, since it follows from the parts of the
  // previous allgatherv, which every rank received; alltoallv's are per
  // peer, from the part sent to it (out) or received from it (in) last
  // call, which the two ends of a pair both know.
  size_t eager_bound(size_t last_part) const;
  size_t eager_allgatherv_ = 0;
  std::vector<size_t> a2a_bound_out_, a2a_bound_in_;
  // The most the eager receive buffers of one call may take, over all peers.
  static constexpr size_t kEagerStagingBytes = size_t{64} << 20;
  uint64_t calls_ = 0;
  // Every byte this rank hands to its sockets goes through note_sent().
  void note_sent(uint64_t n) {
    bytes_sent_ += n;
    if (parent_sent_) *parent_sent_ += n;
  }

  uint64_t bytes_sent_ = 0;
  // What this comm's subgroups sent (they add to it), and for a subgroup,
  // its parent's tally. Comms are used by one thread at a time, a subgroup
  // by its parent's thread, so plain counters suffice.
  std::shared_ptr<uint64_t> subgroups_sent_ = std::make_shared<uint64_t>(0);
  std::shared_ptr<uint64_t> parent_sent_;
  SubgroupConnector subgroup_connector_;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace compcoll
