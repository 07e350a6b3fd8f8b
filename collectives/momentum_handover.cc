#include "collectives/momentum_handover.h"

#include <cmath>

#include "compcoll/error.h"

namespace compcoll {

MomentumHandover::MomentumHandover(std::unique_ptr<Algorithm> inner, float momentum)
    : inner_(std::move(inner)), momentum_(momentum) {
  CC_CHECK(inner_ != nullptr, kInternal, "momentum hand-over without an algorithm");
  CC_CHECK(momentum > 0.0f && momentum < 1.0f, kInvalidArgument,
           "COMPCOLL_MOMENTUM_HANDOVER=1 needs COMPCOLL_MOMENTUM in (0, 1) (the optimizer's "
           "momentum), got ", momentum);
}

std::unique_ptr<CodecState> MomentumHandover::make_state(size_t n, int world_size) const {
  auto st = inner_->make_state(n, world_size);
  st->handed.assign(n, 0.0f);
  return st;
}

CallInfo MomentumHandover::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const {
  // A state restored from a checkpoint written without the hand-over has no
  // mirror: start it at zero, as the optimizer's buffer of a fresh run.
  if (state.handed.size() != n) state.handed.assign(n, 0.0f);
  const CallInfo info = inner_->allreduce(comm, buf, n, average, state);
  hand_over_momentum(buf, state.handed.data(), n, momentum_);
  return info;
}

void hand_over_momentum(float* buf, float* handed, size_t n, float m) {
  for (size_t i = 0; i < n; ++i) {
    const float s = buf[i];
    buf[i] = s - m * handed[i];
    handed[i] = std::isfinite(s) ? s : 0.0f;
  }
}

}  // namespace compcoll
