// Momentum hand-over (COMPCOLL_MOMENTUM_HANDOVER): DGC's momentum correction
// for a script whose optimizer keeps its momentum.
//
// DGC applies the momentum inside the compression (u = m*u + g; v += u) and
// expects an optimizer without momentum that steps by the allreduced sparse
// sum s_t. An unmodified script keeps SGD(momentum=m), which would apply the
// momentum a second time, to stale sparse updates. The hand-over returns
//
//   delta_t = s_t - m * h_(t-1),   then h_t = s_t
//
// instead of s_t, where h mirrors the optimizer's momentum buffer. torch's
// SGD (dampening 0, not Nesterov) then holds buf_t = m*buf_(t-1) + delta_t =
// s_t and steps by exactly DGC's corrected update. Any deviation of the
// optimizer's buffer from the mirror (a skipped step, a buffer the script
// reset) decays by m per step, as it would in the optimizer anyway.
//
// Wraps another algorithm (dgc, sdagc, sbc or csc with COMPCOLL_MOMENTUM > 0) and
// keeps h in the tensor's error-feedback state (CodecState::handed), so it
// survives checkpoints. With COMPCOLL_MOMENTUM_HANDOVER=auto (the default)
// the PyTorch backend learns m from the script's optimizer at its first step
// (integration/pytorch/compcoll/_momentum.py) and the Communicator switches
// to this wrapper then (Communicator::adopt_optimizer_momentum); states made
// before the switch get their velocity and mirror here, at zero, as a fresh
// run's. Every rank computes delta from the same s_t and the
// same h: the output stays bitwise identical across ranks. A non-finite s_i
// reaches the output (its delta is non-finite too) and h_i restarts at 0, so
// it does not poison later steps.
#pragma once

#include <memory>
#include <string_view>

#include "collectives/algorithm.h"

namespace compcoll {

class MomentumHandover final : public Algorithm {
 public:
  // momentum: the correction's factor m, which must equal the optimizer's.
  // hand_over false: the optimizer's momentum was moved here (Adam's beta1
  // set to 0), so s_t goes out unchanged; the wrapper then only gives states
  // made before the adoption their velocity.
  MomentumHandover(std::unique_ptr<Algorithm> inner, float momentum, bool hand_over = true);
  const char* name() const override { return inner_->name(); }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  // The hand-over rewrites every element (s_t - m*s_(t-1)): the inner's
  // support is listed only where nothing is handed over (hand_over false).
  CallInfo allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override {
    return inner_->cost_shape(n, world_size);
  }
  void attach(Comm& comm) override { inner_->attach(comm); }
  void take_attachment(const Algorithm& before) override { inner_->take_attachment(before); }
  const Algorithm& unwrapped() const override { return inner_->unwrapped(); }
  std::string last_decision() const override { return inner_->last_decision(); }
  // Whether it hands over (keeps a mirror in CodecState::handed).
  bool hands_over() const { return hand_over_; }

 private:
  CallInfo run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
               bool list_support) const;

  std::unique_ptr<Algorithm> inner_;
  float momentum_;
  bool hand_over_;
};

// buf = buf - m * handed; handed = buf (the value before), 0 where it is not
// finite. handed must hold n floats.
void hand_over_momentum(float* buf, float* handed, size_t n, float m);

// COMPCOLL_MOMENTUM_MASKING_DENSITY's value for the codecs: "auto" (below 0)
// means always (DGC) for a configured COMPCOLL_MOMENTUM.
double masking_density_or_always(const AlgoParams& p);

// The algorithms with DGC's momentum correction, so with a velocity to hand
// over: dgc, sdagc, sbc, csc.
bool has_momentum_correction(std::string_view algo);

// COMPCOLL_MOMENTUM_HANDOVER=auto applies: asked for, no momentum configured
// (a configured one means the script already runs DGC's recipe), and an
// algorithm with a momentum correction (dgc, sdagc, sbc, csc).
bool takes_optimizer_momentum(std::string_view algo, const AlgoParams& p);

// What COMPCOLL_MOMENTUM_HANDOVER=auto took from the script's optimizer.
struct OptimizerMomentum {
  float m = 0.0f;  // 0: nothing taken
  // false: the optimizer keeps m (torch.optim.SGD) and is handed
  // s_t - m*s_(t-1) (MomentumHandover). true: the optimizer's own momentum
  // was moved here (torch.optim.Adam's beta1, set to 0 by the PyTorch
  // backend) and it is handed s_t itself, DGC's recipe as the paper has it.
  bool moved = false;
  bool operator==(const OptimizerMomentum&) const = default;
};

// The parameters once the optimizer's momentum is known (every rank agreed
// on it): momentum correction m, with the hand-over unless it was moved, and
// masking "auto" resolved to masking only late in the warm-up (dgc, sdagc:
// at densities of at most 2 x COMPCOLL_DENSITY, the end of the warm-up
// and after it, and sbc likewise; csc: 2 x its chunk fraction, after its warm-up, which sends
// every chunk), the settings
// measured best in docs/convergence.md. m == 0 gives p back unchanged.
AlgoParams optimizer_momentum_params(std::string_view algo, const AlgoParams& p,
                                     OptimizerMomentum taken);

}  // namespace compcoll
