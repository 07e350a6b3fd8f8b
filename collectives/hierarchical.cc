#include "collectives/hierarchical.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "collectives/agreement.h"
#include "collectives/lent_comm.h"
#include "compcoll/error.h"
#include "compression/half.h"

namespace compcoll {

Hierarchy::Hierarchy(Comm& world, HostLayout layout, std::unique_ptr<LocalGroup> local,
                     bool sharded)
    : world_(world), layout_(std::move(layout)), local_(std::move(local)) {
  try {
    connect(sharded);
  } catch (const std::exception& e) {
    // A local peer that got further than this rank quotes the cause.
    if (local_) local_->abort(e.what());
    throw;
  }
}

void Hierarchy::connect(bool sharded) {
  Comm& world = world_;
  CC_CHECK_EQ(layout_.world(), world.size(), kInternal, "the host layout covers ", layout_.world(),
              " ranks of a ", world.size(), "-rank world");
  const int r = world.rank();
  CC_CHECK_EQ(local_ ? local_->local_size() : 1, layout_.local_size(r), kInternal,
              "rank ", r, ": the local group's size differs from the layout's");
  // One slice unless sharded below: the host's leader owns it, whole.
  my_slice_ = layout_.is_leader(r) ? 0 : -1;
  // Every rank runs the same transport, so every rank takes the same branch.
  direct_mode_ = world.can_connect_subgroup();
  if (sharded) {
    // Every rank sees the same layout and transport: the same decision.
    if (!direct_mode_) {
      sharded_fallback_ = "the transport cannot connect the slices' subgroups";
    } else if (layout_.min_local_size() < 2) {
      sharded_fallback_ = "some host has a single rank, so a tensor has one slice";
    } else {
      slices_ = layout_.min_local_size();
      const int j = layout_.local_rank(r);
      my_slice_ = j < slices_ ? j : -1;
    }
  }
  if (!direct_mode_) {
    if (is_leader()) on_world_ = std::make_unique<LeaderComm>(world, layout_.leaders());
    return;
  }
  const unsigned long long nonce = shared_nonce(world);
  char name[48];
  if (slices_ > 1) {
    std::snprintf(name, sizeof name, "slice%d-%016llx", my_slice_, nonce);
  } else {
    std::snprintf(name, sizeof name, "leaders-%016llx", nonce);
  }
  std::string error;
  if (is_leader()) {
    try {
      direct_ = world.connect_subgroup(
          slices_ > 1 ? layout_.slice_members(my_slice_) : layout_.leaders(), name);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_step_succeeded(world, slices_ > 1 ? "the slices' ranks could not connect among themselves"
                                          : "the host leaders could not connect among themselves",
                       error);
}

std::vector<size_t> Hierarchy::slice_bounds(size_t n) const {
  constexpr size_t kLine = 16;  // floats per 64-byte cache line
  std::vector<size_t> b(static_cast<size_t>(slices_) + 1, n);
  b[0] = 0;
  for (int j = 1; j < slices_; ++j) {
    b[static_cast<size_t>(j)] = n / static_cast<size_t>(slices_) * static_cast<size_t>(j) / kLine * kLine;
  }
  return b;
}

size_t Hierarchy::state_elems(size_t n) const {
  if (slices_ == 1 || my_slice_ < 0) return n;
  const std::vector<size_t> b = slice_bounds(n);
  return b[static_cast<size_t>(my_slice_) + 1] - b[static_cast<size_t>(my_slice_)];
}

void Hierarchy::fail_now(const std::string& why) noexcept {
  if (failed_.empty()) failed_ = why.empty() ? "unknown error" : why;
  if (local_) local_->abort(why);
  direct_.reset();  // closes the leaders' sockets: the other leaders see it at once
}

Hierarchy::~Hierarchy() = default;

std::string Hierarchy::leaders_in_world_ranks() const {
  // The j-th member of this rank's leaders' group is host j's rank that
  // leads the same slice (slice 0: the host's leader).
  std::string out = detail::concat("world rank ", world_.rank(), " (host hierarchy): the ranks "
                                   "named above are of the leaders' group between hosts, where ");
  const int hosts = layout_.hosts();
  constexpr int kNamed = 16;  // enough to find a peer; a long list says nothing more
  for (int j = 0; j < std::min(hosts, kNamed); ++j) {
    const int world = layout_.members[static_cast<size_t>(j)][static_cast<size_t>(my_slice_)];
    out += detail::concat(j ? ", " : "", "rank ", j, " is world rank ", world);
  }
  if (hosts > kNamed) out += detail::concat(", ... (", hosts, " hosts)");
  return out;
}

void Hierarchy::leader_phase(const std::function<void(Comm& leaders)>& fn) {
  CC_CHECK(failed_.empty(), kTransport, "rank ", world_.rank(),
           ": the host hierarchy failed earlier and must be rebuilt; first error: ", failed_);
  if (direct_mode_) {
    if (!is_leader()) return;  // followers take no part
    // Every exchange between hosts tells the host's ranks waiting for the
    // result that this leader is still at work (LocalGroup::note_progress).
    LentComm leaders(*direct_, [this] {
      if (local_) local_->note_progress();
    });
    // The leaders' subgroup numbers its ranks by host: its errors name
    // peers in that numbering, which the user cannot map to a process.
    try {
      fn(leaders);
    } catch (const TimeoutError& e) {
      throw TimeoutError(detail::concat(e.what(), "; ", leaders_in_world_ranks()), e.limit());
    } catch (const Error& e) {
      throw Error(e.kind(), detail::concat(e.what(), "; ", leaders_in_world_ranks()));
    }
  } else if (is_leader()) {
    try {
      fn(*on_world_);
    } catch (...) {
      on_world_->abandon();  // the others fail now, not at the timeout
      throw;
    }
    on_world_->release();
  } else {
    LeaderComm::follow(world_);
  }
}

void Hierarchy::join_phase_after_local_failure() noexcept {
  // Over the world's calls (LeaderComm) every rank takes part in each
  // exchange of the leader phase: a rank that skipped it would leave the
  // others waiting in the world's next call until the timeout. So a leader
  // whose local step failed ends the phase at once, telling everyone
  // (abandon), and a follower follows it to its end (its own error is the
  // one it throws). Direct leaders need none of this: their subgroup is
  // closed by fail_now, and followers are not in it.
  if (direct_mode_) return;
  try {
    if (is_leader()) {
      if (on_world_) on_world_->abandon();
    } else {
      LeaderComm::follow(world_);
    }
  } catch (...) {
    // The phase failed (as this rank's step did): the caller throws its own.
  }
}

CallInfo Hierarchy::allreduce(const Algorithm& algo, float* buf, size_t n, bool average,
                              CodecState* state) {
  CC_CHECK(buf != nullptr || n == 0, kInvalidArgument, "allreduce of ", n,
           " elements from a null buffer");
  CC_CHECK(!is_leader() || state != nullptr, kInternal,
           "a host leader's compressed allreduce without error-feedback state");
  const auto timeout = world_.timeout();
  CallInfo info;
  if (slices_ > 1) {
    try {
      const std::vector<size_t> b = slice_bounds(n);
      local_->reduce_to_owners(buf, n, b, timeout);
      leader_phase([&](Comm& slice) {
        const size_t lo = b[static_cast<size_t>(my_slice_)];
        const size_t len = b[static_cast<size_t>(my_slice_) + 1] - lo;
        info = algo.allreduce(slice, buf + lo, len, false, *state);
        info.support.reset();  // its indices are the slice's; the gather copies densely
        if (average) scale_in_place(buf + lo, len, world_.size());
      });
      local_->gather_from_owners(buf, n, b, timeout);
    } catch (const std::exception& e) {
      fail_now(e.what());
      throw;
    }
    return info;
  }
  try {
    Addends last_round;
    // The leader's algorithm adds the last round itself (allreduce_host_sum).
    if (local_) {
      try {
        last_round = local_->reduce_to_leader(buf, n, timeout, LocalGroup::LastRound::kReturn);
      } catch (const std::exception& e) {
        fail_now(e.what());  // first: the host's ranks still waiting fail now
        join_phase_after_local_failure();
        throw;
      }
    }
    leader_phase([&](Comm& leaders) {
      // SUM between hosts: the world size, not the number of hosts, divides.
      // Scaling keeps zero words zero, so the support stays true.
      info = local_ ? algo.allreduce_host_sum(leaders, buf, last_round, n, false, *state)
                    : algo.allreduce(leaders, buf, n, false, *state);
      if (average) scale_in_place(buf, n, world_.size());
    });
    if (local_) {
      local_->broadcast_from_leader(buf, n, timeout,
                                    info.support ? &*info.support : nullptr);
    }
  } catch (const std::exception& e) {
    fail_now(e.what());
    throw;
  }
  return info;
}

HierarchicalAlgorithm::HierarchicalAlgorithm(std::unique_ptr<Algorithm> inner, Hierarchy& hierarchy)
    : inner_(std::move(inner)), hierarchy_(hierarchy) {
  CC_CHECK(inner_ != nullptr, kInvalidArgument, "the hierarchy needs an algorithm to run");
}

std::unique_ptr<CodecState> HierarchicalAlgorithm::make_state(size_t n, int) const {
  if (!hierarchy_.is_leader()) return std::make_unique<CodecState>(0);
  return inner_->make_state(hierarchy_.state_elems(n), hierarchy_.layout().hosts());
}

CallInfo HierarchicalAlgorithm::allreduce(Comm&, float* buf, size_t n, bool average,
                                          CodecState& state) const {
  return hierarchy_.allreduce(*inner_, buf, n, average, hierarchy_.is_leader() ? &state : nullptr);
}

void HierarchicalAlgorithm::attach(Comm&) {
  hierarchy_.leader_phase([&](Comm& leaders) { inner_->attach(leaders); });
}

CallInfo run_hierarchical(Hierarchy& h, const Algorithm& algo, void* buf, size_t count,
                          DType dtype, ReduceOp op, CodecState* state) {
  CC_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, kInternal,
           "the hierarchical compressed route takes SUM or AVG");
  const bool average = op == ReduceOp::kAvg;
  if (dtype == DType::kFloat32) return h.allreduce(algo, static_cast<float*>(buf), count, average, state);
  CC_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16, kInternal,
           "the hierarchical compressed route takes float32, float16 or bfloat16");
  auto* p = static_cast<uint16_t*>(buf);
  std::vector<float> f(count);
  const bool bf16 = dtype == DType::kBFloat16;
  for (size_t i = 0; i < count; ++i) f[i] = bf16 ? bf16_to_float(p[i]) : half_to_float(p[i]);
  const CallInfo info = h.allreduce(algo, f.data(), count, average, state);
  for (size_t i = 0; i < count; ++i) p[i] = bf16 ? float_to_bf16(f[i]) : float_to_half(f[i]);
  return info;
}

}  // namespace compcoll
