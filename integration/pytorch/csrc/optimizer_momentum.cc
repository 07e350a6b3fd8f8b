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

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "collectives/momentum_handover.h"
#include "integration/pytorch/csrc/backend.h"

namespace compcoll::torch_integration {

// Only once the group has compressed something: the momentum handed over is
// that of the gradients it compressed, and until then its ranks may step
// optimizers that are not its own, on some ranks only (a probe model fitted
// on rank 0 before training, another group's model), which must not turn
// into a collective the other ranks never join. DDP's first backward pass
// submits its buckets on every rank before any rank's first step.
bool CompcollBackend::awaits_optimizer_momentum() const {
  return !momentum_agreed_.load() && !finished_.load() &&
         takes_optimizer_momentum(cfg_.algo, cfg_.params) &&
         compressible_candidates_.load() > 0;
}

namespace {

// Worker only: the lowest and the highest of every rank's values over the
// inner group (one allreduce, MAX of v and -v). Doubles hold every float and
// every count exactly, so equal values stay equal. A rank without values
// (nullopt: it abstains) takes part in the allreduce without counting; if
// every rank abstains, the lowest is +inf and the highest -inf.
std::vector<std::pair<double, double>> extremes_over_group(
    c10d::Backend& inner, size_t count, const std::optional<std::vector<double>>& values,
    std::chrono::milliseconds timeout) {
  constexpr double kNothing = -std::numeric_limits<double>::infinity();
  std::vector<double> both;
  for (size_t i = 0; i < count; ++i) {
    both.push_back(values ? (*values)[i] : kNothing);
    both.push_back(values ? -(*values)[i] : kNothing);
  }
  at::Tensor t = at::tensor(both, at::kDouble);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  opts.timeout = timeout;
  inner.allreduce(ts, opts)->wait(timeout);
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < count; ++i) {
    out.emplace_back(-t[2 * i + 1].item<double>(), t[2 * i].item<double>());
  }
  return out;
}

}  // namespace

OptimizerMomentum CompcollBackend::optimizer_momentum() const {
  return optimizer_momentum_.load();
}

std::optional<std::pair<float, bool>> CompcollBackend::configured_momentum() const {
  if (cfg_.params.momentum == 0.0f || !has_momentum_correction(cfg_.algo) ||
      compressible_candidates_.load() == 0) {
    return std::nullopt;
  }
  return std::make_pair(cfg_.params.momentum, cfg_.params.momentum_handover);
}

OptimizerMomentum CompcollBackend::agree_optimizer_momentum(
    std::optional<OptimizerMomentum> proposal, const std::string& why) {
  std::lock_guard<std::mutex> lock(momentum_mu_);
  if (!awaits_optimizer_momentum()) return optimizer_momentum();
  auto agreed = std::make_shared<OptimizerMomentum>();
  auto nobody_proposed = std::make_shared<bool>(false);
  worker_->run_and_wait("the agreement on the optimizer's momentum (COMPCOLL_MOMENTUM_HANDOVER=auto)",
                        [=, this] {
    std::optional<std::vector<double>> mine;
    if (proposal) mine = std::vector<double>{proposal->m, proposal->moved ? 1.0 : 0.0};
    const auto ext = extremes_over_group(*inner_, 2, mine, timeout_->get());
    const auto [lowest, highest] = ext[0];
    if (lowest > highest) {  // every rank shadowed a step (DDP's Join): ask again at the next
      *nobody_proposed = true;
      return;
    }
    const bool same = highest == lowest && ext[1].first == ext[1].second;
    if (same && highest > 0.0) *agreed = {static_cast<float>(highest), ext[1].second > 0.0};
    for (const std::shared_ptr<Lane>& lane : {host_, device_}) {
      if (lane != nullptr) lane->adopt_optimizer_momentum(*agreed);
    }
    if (getRank() != 0) return;
    const std::string rank0 = !proposal ? std::string("none, it has run out of inputs under DDP's Join")
                              : !why.empty() ? why
                              : proposal->moved ? std::string("Adam")
                                                : std::string("SGD");
    if (!same) {
      log_.warn("COMPCOLL_MOMENTUM_HANDOVER=auto: the ranks' optimizers disagree (momentum "
                "from ", lowest, " to ", highest, ", ",
                ext[1].first == ext[1].second ? "all of one kind" : "SGD on some, Adam on others",
                "; rank 0: ", rank0, "): no momentum taken over, ", cfg_.algo,
                " runs as configured");
    } else if (agreed->m == 0.0f) {
      log_.info("COMPCOLL_MOMENTUM_HANDOVER=auto: no momentum taken over (rank 0: ", rank0,
                "); ", cfg_.algo, " runs as configured");
    }  // else every lane's Communicator says what it took over
  });
  if (*nobody_proposed) return optimizer_momentum();
  worker_->locked([&] { submissions_at_stage_ = compressed_submissions_; });
  optimizer_momentum_.store(*agreed);
  momentum_agreed_.store(true);
  if (agreed->m == 0.0f) momentum_check_stage_ = 2;  // nothing to check
  return *agreed;
}

void CompcollBackend::check_one_allreduce_per_step(bool counted) {
  std::lock_guard<std::mutex> lock(momentum_mu_);
  if (!momentum_agreed_.load() || momentum_check_stage_ == 2 || finished_.load()) return;
  // A second optimizer stepped right after the first (nothing compressed
  // since) is the same step.
  bool moved = false;
  worker_->locked([&] {
    moved = compressed_submissions_ != submissions_at_stage_;
    submissions_at_stage_ = compressed_submissions_;
  });
  if (!moved) return;
  if (momentum_check_stage_ == 0) {
    // The step after the agreement: count the next whole step's calls.
    worker_->locked([&] {
      count_step_calls_ = true;
      step_calls_ = 0;
      step_keys_.clear();
    });
    momentum_check_stage_ = 1;
    return;
  }
  uint64_t calls = 0, buffers = 0;
  worker_->locked([&] {
    count_step_calls_ = false;
    calls = step_calls_;
    buffers = step_keys_.size();
    step_keys_.clear();
  });
  momentum_check_stage_ = 2;
  const double excess = static_cast<double>(calls) - static_cast<double>(buffers);
  worker_->run_and_wait("the check of one allreduce per optimizer step (COMPCOLL_MOMENTUM_HANDOVER=auto)",
                        [=, this] {
    std::optional<std::vector<double>> mine;
    if (counted) mine = std::vector<double>{excess};
    // No rank counted (every one shadowed the step): -inf, nothing to turn off.
    const double highest = extremes_over_group(*inner_, 1, mine, timeout_->get())[0].second;
    if (highest <= 0.0) return;
    for (const std::shared_ptr<Lane>& lane : {host_, device_}) {
      if (lane != nullptr) lane->adopt_optimizer_momentum({});
    }
    optimizer_momentum_.store(OptimizerMomentum{});
    if (getRank() != 0) return;
    log_.warn("COMPCOLL_MOMENTUM_HANDOVER=auto turned off again: between two optimizer steps "
              "this rank made ", calls, " compressed allreduces of ", buffers,
              " gradient buffers (a rank made up to ", highest, " more calls than buffers), but "
              "the hand-over needs exactly one allreduce of each gradient per optimizer step "
              "(DDP; accumulate with no_sync()). ", cfg_.algo, " runs as configured from the "
              "next call on; set COMPCOLL_MOMENTUM_HANDOVER=0 to skip the attempt");
  });
}

}  // namespace compcoll::torch_integration
