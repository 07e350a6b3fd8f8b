// COMPCOLL_MOMENTUM_HANDOVER=auto on the PyTorch backend: the group agrees
// on the momentum its ranks' optimizers run with and hands it to its lanes'
// Communicators (collectives/momentum_handover.h). Python finds the
// optimizer (compcoll/_momentum.py, a global optimizer step pre-hook); this
// file makes the decision the same on every rank.
//
// Why an agreement: the hand-over's output is s_t - m*h, computed on every
// rank from its own m. Ranks with different m would step their replicas
// apart silently. The proposals travel as one allreduce (MAX of m and -m) on
// the inner Gloo group, issued by the worker in submission order like every
// other inner operation, so it sits between the same two calls on every rank
// (the optimizer steps after DDP's allreduces have completed).
#include <ATen/ATen.h>

#include "collectives/momentum_handover.h"
#include "integration/pytorch/csrc/backend.h"

namespace compcoll::torch_integration {

bool CompcollBackend::awaits_optimizer_momentum() const {
  return !momentum_agreed_.load() && !finished_.load() &&
         takes_optimizer_momentum(cfg_.algo, cfg_.params);
}

float CompcollBackend::agree_optimizer_momentum(float proposal, const std::string& why) {
  if (!awaits_optimizer_momentum()) return 0.0f;
  auto agreed = std::make_shared<float>(0.0f);
  worker_->run_and_wait("the agreement on the optimizer's momentum (COMPCOLL_MOMENTUM_HANDOVER=auto)",
                        [=, this] {
    // Doubles hold every float exactly, so equal proposals stay equal.
    at::Tensor t = at::tensor({static_cast<double>(proposal), -static_cast<double>(proposal)},
                              at::kDouble);
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    opts.timeout = timeout_;
    inner_->allreduce(ts, opts)->wait(timeout_);
    const double highest = t[0].item<double>();
    const double lowest = -t[1].item<double>();
    *agreed = highest == lowest ? static_cast<float>(highest) : 0.0f;
    for (const std::shared_ptr<Lane>& lane : {host_, device_}) {
      if (lane != nullptr) lane->adopt_optimizer_momentum(*agreed);
    }
    if (getRank() != 0) return;
    if (highest != lowest) {
      log_.warn("COMPCOLL_MOMENTUM_HANDOVER=auto: the ranks' optimizers disagree (SGD momentum "
                "from ", lowest, " to ", highest, "; rank 0: ", why.empty() ? "SGD" : why,
                "): no momentum taken over, ", cfg_.algo, " runs as configured");
    } else if (*agreed == 0.0f) {
      log_.info("COMPCOLL_MOMENTUM_HANDOVER=auto: no momentum to take over (", why, "); ",
                cfg_.algo, " runs as configured");
    }  // else every lane's Communicator says what it took over
  });
  optimizer_momentum_.store(*agreed);
  momentum_agreed_.store(true);
  return *agreed;
}

}  // namespace compcoll::torch_integration
