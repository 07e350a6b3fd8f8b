#include "collectives/momentum_handover.h"

#include <algorithm>
#include <cmath>

#include "collectives/registry.h"
#include "compcoll/error.h"

namespace compcoll {

MomentumHandover::MomentumHandover(std::unique_ptr<Algorithm> inner, float momentum,
                                   bool hand_over)
    : inner_(std::move(inner)), momentum_(momentum), hand_over_(hand_over) {
  CC_CHECK(inner_ != nullptr, kInternal, "momentum hand-over without an algorithm");
  CC_CHECK(momentum > 0.0f && momentum < 1.0f, kInvalidArgument,
           "COMPCOLL_MOMENTUM_HANDOVER=1 needs COMPCOLL_MOMENTUM in (0, 1) (the optimizer's "
           "momentum), got ", momentum);
}

std::unique_ptr<CodecState> MomentumHandover::make_state(size_t n, int world_size) const {
  auto st = inner_->make_state(n, world_size);
  if (hand_over_) st->handed.assign(n, 0.0f);
  return st;
}

CallInfo MomentumHandover::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const {
  return run(comm, buf, n, average, state, false);
}

CallInfo MomentumHandover::allreduce_listing_support(Comm& comm, float* buf, size_t n,
                                                     bool average, CodecState& state) const {
  return run(comm, buf, n, average, state, !hand_over_);
}

CallInfo MomentumHandover::run(Comm& comm, float* buf, size_t n, bool average,
                               CodecState& state, bool list_support) const {
  // A state restored from a checkpoint written without the hand-over has no
  // mirror: start it at zero, as the optimizer's buffer of a fresh run.
  // Likewise a state made before the momentum was taken from the optimizer
  // has no velocity yet (the inner algorithm has a correction: momentum_ > 0).
  if (hand_over_ && state.handed.size() != n) state.handed.assign(n, 0.0f);
  if (state.u.size() != n) state.u.assign(n, 0.0f);
  CallInfo info = list_support ? inner_->allreduce_listing_support(comm, buf, n, average, state)
                               : inner_->allreduce(comm, buf, n, average, state);
  if (hand_over_) hand_over_momentum(buf, state.handed.data(), n, momentum_);
  return info;
}

void hand_over_momentum(float* buf, float* handed, size_t n, float m) {
  for (size_t i = 0; i < n; ++i) {
    const float s = buf[i];
    buf[i] = s - m * handed[i];
    handed[i] = std::isfinite(s) ? s : 0.0f;
  }
}

double masking_density_or_always(const AlgoParams& p) {
  return p.momentum_masking_density < 0.0 ? 1.0 : p.momentum_masking_density;
}

bool has_momentum_correction(std::string_view algo) {
  return algo == "dgc" || algo == "sdagc" || algo == "sbc" || algo == "csc";
}

bool takes_optimizer_momentum(std::string_view algo, const AlgoParams& p) {
  return p.momentum_from_optimizer && p.momentum == 0.0f && has_momentum_correction(algo);
}

AlgoParams optimizer_momentum_params(std::string_view algo, const AlgoParams& p,
                                     OptimizerMomentum taken) {
  AlgoParams q = p;
  if (taken.m == 0.0f) return q;
  q.momentum = taken.m;
  q.momentum_handover = !taken.moved;
  if (q.selection == Selection::kAuto) {
    // Adam moves every element by about its learning rate, whatever the
    // gradient's scale: rank by what Adam would move (second_moment.h).
    q.selection = taken.moved ? Selection::kNormalized : Selection::kMagnitude;
  }
  if (q.momentum_masking_density < 0.0) {
    // Under SGD (the hand-over), masked during the warm-up's dense stages,
    // the velocity restarts at every send and the short horizon loses the
    // optimizer's momentum; never masked, stale momentum is delivered late.
    // dgc, sdagc and sbc (whose exact warm-up is dgc's) do best masking only
    // at densities of at most 2 x COMPCOLL_DENSITY: the warm-up's last stage
    // with COMPCOLL_WARMUP_SHAPE=stages, its last 13 % with the smooth shape
    // (at the default density), and after it; csc (whose warm-up sends
    // every chunk) after its warm-up. Under Adam (beta1 moved), Adam
    // normalises the velocity it is fed by that velocity's own second
    // moment, so an unmasked velocity amplifies noise; dgc, sdagc and sbc
    // do best masking at every step, DGC's rule, from the first
    // (docs/convergence.md, "Masking under Adam", over six seeds).
    const bool sparsifier = algo != "csc";
    const double base = sparsifier ? density_for(algo, p) : p.csc_fraction;
    q.momentum_masking_density = taken.moved && sparsifier ? 1.0 : std::min(1.0, 2.0 * base);
  }
  return q;
}

}  // namespace compcoll
