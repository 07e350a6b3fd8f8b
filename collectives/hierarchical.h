// The two-level host hierarchy (COMPCOLL_HIERARCHY): a compressed allreduce
// in three steps.
//
//   1. local reduce   the ranks of a host sum their gradients densely into
//                     the host's leader over a LocalGroup (shared memory,
//                     transport/shm_group.h), not over the network;
//   2. leader phase   the leaders, one per host, run the configured algorithm
//                     (any of them, unchanged) on their host sums over the
//                     leaders' communicator: a subgroup connected directly
//                     between the leaders when the world's transport can
//                     (Comm::connect_subgroup: Gloo), so the other ranks
//                     take no part and no message of theirs costs the
//                     leaders a wake-up; else a LeaderComm (leader_comm.h)
//                     on the world's own calls, which the other ranks follow;
//   3. share back     each leader copies the result to its host's ranks.
//
// Why it pays: a host's ranks put one compressed payload per host on the
// network instead of one each, only leaders spend time compressing, and the
// local step moves memory, not packets.
//
// Error-feedback state lives on the leaders only: the leader is the one rank
// of a host that compresses, so the residual is the host sum's residual (what
// the host as a whole has not yet sent), sized for the leader communicator
// (onebit's server error by the number of hosts). Followers hold none: what
// they contribute enters the host sum at once and is never partly held back
// on their side. Leadership is fixed for the communicator's lifetime (the
// lowest world rank of each host); a layout change means a new communicator,
// which starts with empty residuals like any rebuilt communicator.
//
// Sharded (COMPCOLL_HIERARCHY=shards): with a core per rank, one leader
// compressing the whole host sum is slower than the ranks compressing in
// parallel (docs/scaling.md). Sharded, every tensor is cut into S slices,
// S the smallest host's number of ranks, and local rank j < S leads slice
// j: the host's ranks reduce each slice into its owner over the shared
// segment (LocalGroup::reduce_to_owners), the hosts' j-th ranks run the
// algorithm on slice j over a subgroup of their own, and every rank gathers
// all slices back (gather_from_owners). Each owner keeps its slice's error
// feedback: the residual of that slice of the host sum, so nothing is held
// twice and nothing is lost. It needs subgroups (Gloo); elsewhere, or with a
// host of one rank, it runs with one leader per host and says why.
//
// Arithmetic: the algorithm sums the host sums (SUM); AVG divides the result
// by the world size on the leaders before it is shared, so every rank gets
// the same bits. Local clipping (COMPCOLL_CLIP) applies to the host sum with
// the number of hosts as the algorithm's world size. Non-finite values in any
// rank's gradient reach the host sum and hence the output.
//
// Failures: every local wait is bounded by the world timeout, counted for a
// wait on a leader (or slice owner) from its last exchange between hosts
// (LocalGroup::note_progress); a local peer that dies or fails is named in
// the error; a rank failing in any step aborts its local group so that its
// host's ranks fail at once, and ranks of other hosts fail through the world
// Comm within its timeout.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "collectives/algorithm.h"
#include "collectives/host_layout.h"
#include "collectives/leader_comm.h"

namespace compcoll {

// The ranks of one host and a fast way to move float32 buffers among them.
// Every method is collective over the host's ranks, and every wait ends
// within `timeout` with kTransport naming the local peer it waited for.
class LocalGroup {
 public:
  virtual ~LocalGroup() = default;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // What the leader does with the last round of reduce_to_leader (a call
  // moves its buffer in rounds): add it into buf, or return where the other
  // ranks' parts of it lie, for its algorithm to add in its own first pass
  // over buf (Algorithm::allreduce_host_sum): one write and one read of the
  // tensor fewer. The parts stay valid until broadcast_from_leader.
  enum class LastRound { kAdd, kReturn };
  // The leader's (local rank 0's) buf becomes the sum of every local rank's
  // buf, added in local-rank order (with kReturn: buf plus the returned
  // addends is that sum); the others' buf is left as it was, and they get
  // no addends. All local ranks pass the same n (a different n is kMismatch).
  virtual Addends reduce_to_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                                   LastRound last) = 0;
  // Every local rank's buf becomes the leader's buf. support (the leader's;
  // null where unknown) lists every index where the leader's buf can be
  // nonzero, so that it need not be scanned for them (CallInfo::support).
  virtual void broadcast_from_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                                     const std::vector<uint32_t>* support) = 0;
  // Sharded hierarchy (COMPCOLL_HIERARCHY=shards): the tensor is cut into
  // S slices, bounds[j] to bounds[j + 1] (S + 1 ascending bounds, the last
  // n), and local rank j < S owns slice j. reduce_to_owners: every owner's
  // buf holds, in its slice, the sum of every local rank's buf there, added
  // in local-rank order; the rest of every buf is left as it was.
  // gather_from_owners: every local rank's buf becomes, slice by slice, its
  // owner's buf. All local ranks pass the same n and bounds.
  virtual void reduce_to_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                                std::chrono::milliseconds timeout) = 0;
  virtual void gather_from_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                                  std::chrono::milliseconds timeout) = 0;
  // Marks the group failed, so that local peers waiting on this rank fail
  // now, naming it and `why`, instead of at their timeout. Never throws.
  virtual void abort(const std::string& why) noexcept = 0;
  // Says that this rank is still working on the call between hosts: the
  // leader phase calls it as each of its exchanges starts and ends. A local
  // peer waiting on this rank for the result gives up only once `timeout`
  // has passed without such a sign (each exchange is bounded by the timeout
  // itself, and a leader phase may hold several), so a slow but live phase
  // does not fail the host's other ranks while their leader succeeds.
  virtual void note_progress() noexcept = 0;
};

class Hierarchy {
 public:
  // world: the communicator of all ranks (outlives this object). local: the
  // host's group, null when this rank is alone on its host.
  // sharded (COMPCOLL_HIERARCHY=shards): every local rank j < S, S the
  // smallest host's number of ranks, leads slice j of every tensor between
  // the hosts' j-th ranks, instead of local rank 0 leading all of it. Needs
  // subgroups (Comm::can_connect_subgroup) and S >= 2; else the one leader
  // per host (sharded_fallback() says why).
  Hierarchy(Comm& world, HostLayout layout, std::unique_ptr<LocalGroup> local,
            bool sharded = false);
  ~Hierarchy();

  const HostLayout& layout() const { return layout_; }
  // Whether this rank compresses (a leader, or a slice's owner) and keeps
  // error-feedback state.
  bool is_leader() const { return my_slice_ >= 0; }
  // S: how many slices a tensor is cut into (1: one leader per host).
  int slices() const { return slices_; }
  // This rank's slice, -1 when it owns none. With one slice (one leader
  // per host) the leader's is 0: the whole tensor.
  int my_slice() const { return my_slice_; }
  // Why a sharded hierarchy runs with one leader per host ("" otherwise).
  const std::string& sharded_fallback() const { return sharded_fallback_; }
  // The slices of an n-element tensor: S + 1 ascending bounds from 0 to n,
  // cut at multiples of 16 elements (64-byte lines).
  std::vector<size_t> slice_bounds(size_t n) const;
  // The error-feedback state's element count for an n-element tensor on
  // this rank: its slice's length when sharded, else n.
  size_t state_elems(size_t n) const;
  // The leaders' communicator (sharded: this rank's slice's); null on
  // followers (and after a failure).
  Comm* leaders() { return direct_ ? direct_.get() : static_cast<Comm*>(on_world_.get()); }
  // Whether the leaders talk over a subgroup of their own (no followers).
  bool leaders_connected_directly() const { return direct_mode_; }

  // Collective over the world: leaders run fn on the leaders' communicator,
  // the others follow until the leaders are done.
  void leader_phase(const std::function<void(Comm& leaders)>& fn);

  // Collective: in-place allreduce of n float32 over the world (SUM, or AVG
  // when average) through the three steps. state: the leader's error
  // feedback (made by algo.make_state(n, layout().hosts())); null on
  // followers. Returns the algorithm's CallInfo on leaders, zeros elsewhere.
  CallInfo allreduce(const Algorithm& algo, float* buf, size_t n, bool average, CodecState* state);

  // A failed step leaves the hierarchy unusable: the local group is
  // aborted and the leaders' direct subgroup closed, so that peers in
  // either fail now, quoting `why`, rather than at their timeout. Its owner
  // calls it too when it fails after building the hierarchy (a
  // communicator's creation), so that a local peer that got further names
  // that cause, not only "left the communicator".
  void fail_now(const std::string& why) noexcept;

 private:
  // The constructor's work: slices, and the leaders' (or slices') subgroup.
  void connect(bool sharded);
  // A rank whose local step failed before the leader phase still takes its
  // part in the phase's world calls (LeaderComm only): see the definition.
  void join_phase_after_local_failure() noexcept;
  Comm& world_;
  HostLayout layout_;
  std::unique_ptr<LocalGroup> local_;
  int slices_ = 1;
  int my_slice_ = -1;
  // "world rank 5 (host hierarchy): ... rank 1 is world rank 2, ...": appended
  // to an error of the leaders' subgroup, whose ranks are host indices.
  std::string leaders_in_world_ranks() const;
  std::string sharded_fallback_;
  bool direct_mode_ = false;
  std::unique_ptr<Comm> direct_;             // leaders' subgroup (direct mode)
  std::unique_ptr<LeaderComm> on_world_;     // else: on the world's calls
  std::string failed_;
};

// Any algorithm behind the hierarchy, as an Algorithm: for code that runs
// algorithms directly on a world Comm (the benchmark) instead of through a
// Communicator. allreduce(comm, ...) ignores comm (the hierarchy has its
// world) and takes the three steps; attach() runs the inner algorithm's in a
// leader phase; followers' states are empty (they keep no error feedback).
// The hierarchy must outlive this object.
class HierarchicalAlgorithm final : public Algorithm {
 public:
  HierarchicalAlgorithm(std::unique_ptr<Algorithm> inner, Hierarchy& hierarchy);
  const char* name() const override { return inner_->name(); }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  // The leaders' call: what one leader sends between hosts.
  CostShape cost_shape(size_t n, int world_size) const override {
    return inner_->cost_shape(n, hierarchy_.layout().hosts());
  }
  void attach(Comm& comm) override;
  std::string last_decision() const override { return inner_->last_decision(); }
  const Algorithm& inner() const { return *inner_; }

 private:
  std::unique_ptr<Algorithm> inner_;
  Hierarchy& hierarchy_;
};

// The hierarchical counterpart of run_allreduce (dispatch.h) for the
// compressed route: float32 in place; fp16/bf16 through an fp32 copy (so the
// host sum and the residuals are fp32). op is SUM or AVG.
CallInfo run_hierarchical(Hierarchy& h, const Algorithm& algo, void* buf, size_t count,
                          DType dtype, ReduceOp op, CodecState* state);

}  // namespace compcoll
