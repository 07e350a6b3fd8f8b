// Communicator's error-feedback checkpoints: COMPCOLL_STATE_DIR (loaded
// collectively at creation, saved at finish) and the explicit save_state /
// load_state / load_state_agreed of the C API and the PyTorch package. The
// rule throughout: the ranks restore together or none does, and a file that
// is not restored is moved aside with the reason, never overwritten in
// silence.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "collectives/agreement.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/state_file.h"

namespace compcoll {
namespace {

// COMPCOLL_STATE_DIR files claimed by live communicators of this process.
// Two communicators saving to one file would each load the other's
// residuals at the next start: the second one is refused its file instead.
// Never destroyed, as the claims (below).
std::mutex& state_claims_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<std::string>& state_claims() {
  // Never destroyed: a communicator finished by an exit hook (the NCCL
  // interposer's, the C API's) releases its claim after static destructors
  // may have run.
  static auto* claims = new std::set<std::string>();
  return *claims;
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

// "a=1;b=2" vs "a=1;b=3" -> "b=3 (checkpoint: b=2)": the settings that differ.
std::string describe_difference(const std::string& mine, const std::string& theirs) {
  auto fields = [](const std::string& d) {
    std::set<std::string> out;
    std::stringstream ss(d);
    for (std::string f; std::getline(ss, f, ';');) out.insert(f);
    return out;
  };
  const auto a = fields(mine), b = fields(theirs);
  std::string now, then;
  for (const auto& f : a) {
    if (!b.count(f)) now += (now.empty() ? "" : ";") + f;
  }
  for (const auto& f : b) {
    if (!a.count(f)) then += (then.empty() ? "" : ";") + f;
  }
  return now + " (checkpoint: " + then + ")";
}

}  // namespace

void Communicator::release_state_claim() {
  // Once: at finish() and again at destruction, when another communicator
  // may hold the path by then.
  if (state_path_.empty() || state_claim_released_) return;
  state_claim_released_ = true;
  std::lock_guard<std::mutex> lock(state_claims_mu());
  state_claims().erase(state_path_);
}

std::string Communicator::state_description() const {
  Config c = cfg_;
  c.state_dir.clear();
  return c.agreement_description();
}

// "compcoll-state[-TAG]-rank": every checkpoint file of this communicator's
// name starts so, followed by "R-ofP.bin".
std::string Communicator::state_file_prefix() const {
  std::string prefix = "compcoll-state";
  if (!cfg_.state_tag.empty()) prefix += "-" + cfg_.state_tag;
  return prefix + "-rank";
}

// Collective: the smallest and largest clock the ranks hold. (A clock counts
// calls: far below 2^63, so int64 holds it.)
std::pair<int64_t, int64_t> Communicator::clock_range(uint64_t clock) {
  int64_t lo = static_cast<int64_t>(clock), hi = lo;
  comm_->allreduce(&lo, 1, DType::kInt64, ReduceOp::kMin);
  comm_->allreduce(&hi, 1, DType::kInt64, ReduceOp::kMax);
  return {lo, hi};
}

std::string Communicator::state_file_path() {
  const std::string name =
      state_file_prefix() + std::to_string(rank()) + "-of" + std::to_string(size()) + ".bin";
  const std::string path = (std::filesystem::path(cfg_.state_dir) / name).string();
  std::lock_guard<std::mutex> lock(state_claims_mu());
  if (!state_claims().insert(path).second) {
    log_.warn("COMPCOLL_STATE_DIR: another communicator of this process uses ", path,
              "; this one's error-feedback state is neither loaded nor saved");
    return {};
  }
  return path;
}

// Collective: every rank restores its checkpoint, or none does (a partial
// restore would still give the same answer everywhere, but not the run that
// was checkpointed). An unreadable checkpoint fails every rank.
void Communicator::load_state_dir() {
  if (cfg_.state_dir.empty()) return;
  state_path_ = state_file_path();
  // -2 the directory is unusable, -1 the checkpoint is unreadable, 0 fresh,
  // 1 restored.
  int32_t outcome = 0;
  std::string error;
  if (!state_path_.empty()) {
    std::error_code ec;
    if (error = state_dir_problem(cfg_.state_dir); !error.empty()) {
      // Now, not at exit: a long run would otherwise end with its state
      // unsaved and a warning nobody reads.
      outcome = -2;
    } else if (!std::filesystem::exists(state_path_, ec)) {
      if (const std::string others = other_world_sizes(false); !others.empty()) {
        log_.warn("COMPCOLL_STATE_DIR: no checkpoint ", state_path_, ", but ", others, " of a run "
                  "of another world size: a checkpoint is used only at its own size, so this "
                  "run starts fresh; when it saves, they are moved to <file>.unused (left in "
                  "place, a later run of that size would restore them, older than its model "
                  "checkpoint; a run that ends without saving leaves them)");
      } else if (std::filesystem::exists(state_path_ + ".restored", ec)) {
        // The run that restored it ended without saving (it failed, or was
        // killed): its state is older than the script's model checkpoint.
        log_.warn("COMPCOLL_STATE_DIR: no checkpoint ", state_path_, ": the run that restored ",
                  state_path_, ".restored ended without saving (it failed or was killed), so "
                  "this one starts fresh rather than restore that older state");
      } else {
        log_.info("COMPCOLL_STATE_DIR: no checkpoint ", state_path_, " yet: starting fresh");
      }
    } else {
      try {
        std::string why_not;
        outcome = load_state(read_binary_file(state_path_), &why_not) ? 1 : 0;
        if (outcome == 0) set_aside_unused_checkpoint(why_not);
      } catch (const std::exception& e) {
        // Any failure (a directory where the file should be, say) is this
        // rank's outcome, told to the others below: never an exception that
        // skips the exchange and leaves them waiting. (Inside this error's
        // message: without its own "compcoll: ".)
        error = message_without_prefix(e);
        outcome = -1;
      }
    }
  }
  int32_t all = outcome;
  comm_->allreduce(&all, 1, DType::kInt32, ReduceOp::kMin);
  if (all < 0) {
    // The constructor throws, so no destructor will release the file: do it
    // here, or a retry in this process would find it claimed.
    release_state_claim();
    const std::string& what = outcome == -2 ? cfg_.state_dir : state_path_;
    if (outcome < 0) CC_THROW(kInvalidArgument, "COMPCOLL_STATE_DIR ", what, ": ", error);
    CC_CHECK(all != -2, kInvalidArgument, "COMPCOLL_STATE_DIR: another rank cannot write to its "
             "directory (its error names it and why)");
    CC_THROW(kInvalidArgument, "COMPCOLL_STATE_DIR: another rank's checkpoint is unreadable (its "
             "error names the file); remove it or the directory to start fresh");
  }
  if (all == 1) {
    // Checkpoints saved together at the end of one run have one clock (the
    // ranks make the same calls). Different clocks mean the files are of
    // different points: a rank failed or was killed and kept an older file
    // while the others saved, or files of different runs are mixed. Each
    // rank's residual is then of another step, and under a momentum
    // hand-over the replicas' parameters would drift apart in silence.
    const auto [lo, hi] = clock_range(states_.clock());
    if (lo != hi) {
      start_fresh();
      // Kept as <file>.unused, not replaced by this run's save: which of
      // them is the newer one is the user's to judge.
      set_aside_unused_checkpoint("the ranks' checkpoints were saved at different points", false);
      if (rank() == 0) {
        log_.warn("COMPCOLL_STATE_DIR ", cfg_.state_dir, ": the ranks' checkpoints were saved at "
                  "different points (after ", lo, " to ", hi, " calls: a rank failed or was killed "
                  "before the others saved, or files of different runs are mixed): every rank "
                  "starts fresh, and each moves its file to <file>.unused so that this run's "
                  "save does not replace it");
      }
      return;
    }
  }
  if (all == 1) {
    // A checkpoint is restored once: a run that then fails (and so does not
    // save) must not leave this older state for the next start, whose model
    // checkpoint is newer, to restore again. Kept as <file>.restored.
    std::error_code ec;
    std::filesystem::rename(state_path_, state_path_ + ".restored", ec);
    if (ec) log_.warn("COMPCOLL_STATE_DIR: cannot move ", state_path_, " to .restored (",
                      ec.message(), "): a run that fails before saving leaves it to be restored again");
    return;
  }
  if (all == 0 && outcome == 1) {
    // Every rank restores or none does; this rank's checkpoint was good, so
    // it is moved aside (and said at WARN), not overwritten by this run's
    // save: a rank whose file went missing (a wiped local disk) must not
    // cost the others theirs.
    start_fresh();
    set_aside_unused_checkpoint("another rank has no usable checkpoint (its INFO or WARN line "
                                "says why), and all ranks restore or none does");
  }
}

// Checkpoints of this communicator's name for another world size: this
// rank's own, and on rank 0 those of ranks this run does not have (a larger
// run before), so that none is left behind on a shared directory. With
// move, they go to <file>.unused (this run's save is newer than them). Says
// which, or "" when there are none.
std::string Communicator::other_world_sizes(bool move) {
  const std::string prefix = state_file_prefix();
  std::vector<std::string> moved;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(cfg_.state_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int r = -1, p = -1;
    char tail[8] = {};
    if (name.rfind(prefix, 0) != 0 ||
        std::sscanf(name.c_str() + prefix.size(), "%d-of%d%7s", &r, &p, tail) != 3 ||
        std::string(tail) != ".bin" || p == size()) {
      continue;
    }
    if (r != rank() && !(rank() == 0 && r >= size())) continue;
    std::error_code moved_ec;
    if (move) std::filesystem::rename(it->path(), it->path().string() + ".unused", moved_ec);
    if (!moved_ec) moved.push_back(name);
  }
  std::string out;
  for (const std::string& m : moved) out += (out.empty() ? "" : ", ") + m;
  return out;
}

// A checkpoint of another configuration (or world) is not restored, and
// this run saves its own to the same path at the end: the old one is moved
// aside to "<file>.unused" (replacing an older one) so that nothing is lost
// in silence, said at WARN (once per process: every rank of a run finds the
// same reason).
void Communicator::set_aside_unused_checkpoint(const std::string& why, bool say) {
  const std::string aside = state_path_ + ".unused";
  std::error_code ec;
  std::filesystem::rename(state_path_, aside, ec);
  static std::atomic<bool> said{false};
  if (!say || said.exchange(true)) return;
  log_.warn("COMPCOLL_STATE_DIR: checkpoint ", state_path_, " not used (", why, "); ",
            ec ? "it could not be moved aside (" + ec.message() + ") and this run's save "
                 "replaces it"
               : "moved to " + aside + ", and this run saves its own in its place",
            "; every rank starts fresh (said once per process)");
}

// What a rank restored is dropped again: every rank starts as if there had
// been no checkpoint.
void Communicator::start_fresh() {
  states_.clear();
  states_.set_clock(0);
  adopt_optimizer_momentum({});
}

Bytes Communicator::save_state(size_t* saved_entries) {
  // A failed call can leave a residual half-updated (its selection taken
  // out, the result never applied): no checkpoint of that.
  check_not_broken();
  states_.bring_to_host();  // device-resident residuals are saved as host ones
  StateFile f;
  f.description = state_description();
  f.config_hash = config_hash(f.description);
  f.rank = rank();
  f.world_size = size();
  f.clock = states_.clock();
  f.optimizer_momentum = optimizer_momentum_;
  size_t skipped = 0;
  for (const StateStore::Saved& s : states_.saved()) {
    if (s.key->rfind("addr:", 0) == 0) {  // a NULL key's: an address
      ++skipped;
      continue;
    }
    f.entries.push_back({*s.key, s.idle, s.state, nullptr});
  }
  if (skipped) {
    // At WARN: the caller asked for a checkpoint and gets less than it holds.
    log_.warn("checkpoint leaves out ", skipped, " of ", skipped + f.entries.size(),
              " error-feedback states: those of calls with a NULL key, keyed by their buffer's "
              "address, which means nothing to another process; pass a key to keep them");
  }
  if (saved_entries != nullptr) *saved_entries = f.entries.size();
  return serialize_state_file(f);
}


bool Communicator::adopt_optimizer_momentum(OptimizerMomentum taken) {
  if (taken.m == 0.0f) taken.moved = false;  // nothing taken has no kind
  if (!takes_optimizer_momentum(cfg_.algo, cfg_.params) || taken == optimizer_momentum_) return false;
  CC_CHECK(taken.m >= 0.0f && taken.m < 1.0f, kInvalidArgument, "optimizer momentum ", taken.m,
           " is outside [0, 1): compcoll cannot take it over");
  const AlgoParams p = optimizer_momentum_params(cfg_.algo, cfg_.params, taken);
  std::unique_ptr<Algorithm> next = make_algorithm(cfg_.algo, p);
  if (taken.moved) {
    // States made before now have no velocity: the wrapper gives them one.
    next = std::make_unique<MomentumHandover>(std::move(next), taken.m, /*hand_over=*/false);
  }
  next->take_attachment(*algo_);
  algo_ = std::move(next);
  optimizer_momentum_ = taken;
  const std::string masking = p.momentum_masking_density >= 1.0
                                  ? std::string("at every step")
                                  : detail::concat("at densities <= ", p.momentum_masking_density);
  if (taken.m > 0.0f && taken.moved) {
    log_.info("COMPCOLL_MOMENTUM_HANDOVER=auto: the optimizer's momentum ", taken.m,
              " (Adam's beta1) is moved into compcoll on every rank: ", cfg_.algo,
              " applies DGC's momentum correction with it and the optimizer runs with beta1 = 0, "
              "momentum factor masking ", masking, ", ranking by ",
              p.selection == Selection::kNormalized ? "normalized value" : "magnitude",
              ", from the next call on");
  } else if (taken.m > 0.0f) {
    log_.info("COMPCOLL_MOMENTUM_HANDOVER=auto: the optimizer's SGD momentum is ", taken.m,
              ", as the ranks agreed: ", cfg_.algo, " applies DGC's momentum correction with it and hands "
              "the optimizer s_t - m*s_(t-1), momentum factor masking ", masking,
              ", from the next call on");
  } else {
    log_.info("COMPCOLL_MOMENTUM_HANDOVER=auto: no momentum taken from the optimizer any more; ",
              cfg_.algo, " runs as configured from the next call on");
  }
  return true;
}

// Parses a checkpoint and says in `why` why this communicator cannot use it
// ("" when it can). A usable one leaves the momentum it was written with
// adopted (its velocity sizes are checked under it); the caller applies the
// file or refuses it (refuse_state puts the momentum back).
StateFile Communicator::check_state(std::span<const uint8_t> bytes, std::string& why) {
  StateFile f = parse_state_file(bytes);
  const std::string mine = state_description();
  why.clear();
  if (f.world_size != size() || f.rank != rank()) {
    why = "it was written by rank " + std::to_string(f.rank) + " of " +
          std::to_string(f.world_size) + ", this is rank " + std::to_string(rank()) + " of " +
          std::to_string(size());
  } else if (f.description != mine || f.config_hash != config_hash(mine)) {
    why = "the configuration differs: " + describe_difference(mine, f.description);
  }
  // The momentum the checkpointed run took from its optimizer is taken up
  // again now, before the first call, so that a resumed run computes what
  // the uninterrupted one would; its optimizer confirms it at its first step.
  // A checkpoint written before that step (0) leaves a momentum this run
  // already took from the same optimizer in place.
  const OptimizerMomentum momentum_before = optimizer_momentum_;
  if (why.empty() && f.optimizer_momentum.m > 0.0f && f.optimizer_momentum != optimizer_momentum_) {
    if (!takes_optimizer_momentum(cfg_.algo, cfg_.params)) {
      why = "it was written with a momentum taken from the optimizer, which this configuration "
            "does not take";
    } else {
      adopt_optimizer_momentum(f.optimizer_momentum);
    }
  }
  // The hand-over gives a state without a velocity one at its next call.
  const bool velocity_made_lazily = &algo_->unwrapped() != algo_.get();
  std::set<std::string> seen;
  for (const StateFileEntry& e : f.entries) {
    if (!why.empty()) break;
    const size_t n = e.state->size();
    // Shaped as allreduce() shapes it: under the hierarchy, for the leaders.
    const auto fresh = algo_->make_state(n, hier_ ? hier_->layout().hosts() : size());
    // A hand-over mirror kept by call order (set_handover_order_key): a
    // mirror and nothing else.
    const bool order = e.key.rfind("order:", 0) == 0;
    if ((!order && e.key.rfind("key:", 0) != 0) || !seen.insert(e.key).second) {
      why = "entry '" + e.key + "' is not a unique explicit key";
    } else if (order && (n != 0 || !e.state->u.empty() || !e.state->second_moment.empty() ||
                         !e.state->regions.empty())) {
      why = e.key + " holds more than a hand-over mirror";
    } else if (!std::isfinite(e.state->lambda) || !all_finite(e.state->v) ||
               !all_finite(e.state->u) || !all_finite(e.state->second_moment) ||
               !all_finite(e.state->handed)) {
      // Residuals never hold NaN/Inf (DESIGN.md): such a file was not written by compcoll.
      why = e.key + " holds non-finite values";
    } else if (fresh->u.size() != e.state->u.size() &&
               !(velocity_made_lazily && e.state->u.empty())) {
      why = e.key + " has a momentum/server error of " + std::to_string(e.state->u.size()) +
            " elements where " + cfg_.algo + " keeps " + std::to_string(fresh->u.size()) +
            " for its " + std::to_string(n);
    } else if (!e.state->second_moment.empty() && e.state->second_moment.size() != n) {
      why = e.key + " has a second moment of " + std::to_string(e.state->second_moment.size()) +
            " elements for its " + std::to_string(n);
    } else if (std::any_of(e.state->second_moment.begin(), e.state->second_moment.end(),
                           [](float s) { return s < 0.0f; })) {
      why = e.key + " has a negative second moment";  // a mean of squares never is
    }
  }
  if (!why.empty()) adopt_optimizer_momentum(momentum_before);
  return f;
}

void Communicator::refuse_state(const OptimizerMomentum& before, const std::string& why,
                                std::string* why_not) {
  adopt_optimizer_momentum(before);
  if (why_not != nullptr) {
    *why_not = why;
  } else {
    log_.warn("checkpointed error-feedback state not used (", why, "): keeping the current one");
  }
}

bool Communicator::load_state(std::span<const uint8_t> bytes, std::string* why_not) {
  const OptimizerMomentum before = optimizer_momentum_;
  std::string why;
  StateFile f = check_state(bytes, why);
  if (!why.empty()) {
    refuse_state(before, why, why_not);
    return false;
  }
  apply_state(f);
  return true;
}

bool Communicator::load_state_agreed(std::optional<std::span<const uint8_t>> bytes) {
  const OptimizerMomentum before = optimizer_momentum_;
  // -1 nothing offered, 0 not usable here, 1 usable.
  int32_t mine = -1;
  std::string why;
  std::optional<StateFile> f;
  std::exception_ptr unreadable;
  if (bytes) {
    try {
      f = check_state(*bytes, why);
      mine = why.empty() ? 1 : 0;
    } catch (...) {
      // Told to the others first, then thrown: never an exception that
      // skips the exchange and leaves them waiting.
      unreadable = std::current_exception();
      adopt_optimizer_momentum(before);
      mine = 0;
    }
  }
  int32_t lo = mine, hi = mine;
  comm_->allreduce(&lo, 1, DType::kInt32, ReduceOp::kMin);
  comm_->allreduce(&hi, 1, DType::kInt32, ReduceOp::kMax);
  if (lo == 1) {
    // Saved together, the ranks' files have one clock (as load_state_dir).
    const auto [first, last] = clock_range(f->clock);
    if (first == last) {
      apply_state(*f);
      return true;
    }
    why = detail::concat("the ranks' checkpoints were saved at different points (after ", first,
                         " to ", last, " calls), and the ranks restore together or none does");
  }
  if (unreadable) std::rethrow_exception(unreadable);
  if (hi == -1) return false;  // no rank offered one
  if (mine == 1 && lo != 1) {
    why = "another rank of the group has no usable checkpoint (it offered none, or its WARN says "
          "why), and the ranks restore together or none does: a restore on some ranks only "
          "would make the replicas drift apart under a momentum hand-over";
  }
  if (mine >= 0) refuse_state(before, why, nullptr);
  return false;
}

void Communicator::apply_state(StateFile& f) {
  states_.clear();
  states_.set_clock(f.clock);
  for (StateFileEntry& e : f.entries) states_.put(e.key, std::move(e.owned), e.idle);
  log_.info("restored the error-feedback state of ", f.entries.size(), " tensors (",
            states_.memory_bytes() / 1e6, " MB), checkpoint hash ", std::hex, f.config_hash,
            std::dec, " (the configuration without COMPCOLL_STATE_DIR)");
  refresh_stats_snapshot();
}

}  // namespace compcoll
