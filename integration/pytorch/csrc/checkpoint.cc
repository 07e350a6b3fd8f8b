// Error-feedback checkpoints of a compcoll torch backend (compcoll.state_dict
// / compcoll.load_state_dict): each lane's Communicator saves and restores
// its own state (plugin/state_file.h), on the worker, so that nothing queued
// before runs concurrently with it and everything queued after sees the
// restored state. A loss-scale change rescales the state the same way, and
// under a loss scaler a skipped step leaves it alone (note_loss_scaled).
//
// Loading is collective over a lane's ranks (Communicator::load_state_agreed):
// every rank of the group calls load_state_dict, with its own state_dict or
// None, and they restore together or none does.
//
// A lane whose Communicator does not exist yet (a device lane before its
// first candidate) cannot take state: making its Communicator is collective
// and happens at a point of the submission order every rank shares, which a
// load call is not. Its bytes are reported unused (False) and an INFO line
// says why.
#include <atomic>
#include <cmath>
#include <exception>
#include <memory>
#include <optional>
#include <span>

#include "integration/pytorch/csrc/backend.h"

namespace compcoll::torch_integration {

std::map<std::string, Bytes> CompcollBackend::save_state() {
  auto out = std::make_shared<std::map<std::string, Bytes>>();
  worker_->run_and_wait("state_dict", [out, host = host_, device = device_] {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      if (lane != nullptr && lane->comm() != nullptr) (*out)[lane->name()] = lane->comm()->save_state();
    }
  });
  return *out;
}

std::map<std::string, bool> CompcollBackend::load_state(const std::map<std::string, Bytes>& lanes) {
  // Every name must be a lane of this backend: a checkpoint of a cuda group
  // offered to a cpu-only one is the caller's mistake, not a fresh start.
  // Thrown after the collective load, which this rank joins offering
  // nothing: the other ranks are in it already and would wait for it.
  std::exception_ptr unknown_lane;
  for (const auto& [name, bytes] : lanes) {
    try {
      (void)lane_named(name);
    } catch (...) {
      unknown_lane = std::current_exception();
    }
  }
  auto in = std::make_shared<std::map<std::string, Bytes>>(
      unknown_lane ? std::map<std::string, Bytes>() : lanes);
  auto used = std::make_shared<std::map<std::string, bool>>();
  worker_->run_and_wait("load_state_dict", [in, used, host = host_, device = device_,
                                            log = log_] {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      if (lane == nullptr) continue;
      const auto it = in->find(lane->name());
      if (lane->comm() == nullptr) {
        if (it == in->end()) continue;
        log.info("load_state_dict: the ", lane->name(), " lane has not reduced anything yet, so ",
                 "its checkpointed error-feedback state is not used (fresh start)");
        (*used)[lane->name()] = false;
        continue;
      }
      // Collective over the lane's ranks, also where this rank has nothing
      // for it: they restore together or none does.
      std::optional<std::span<const uint8_t>> bytes;
      if (it != in->end()) bytes = std::span<const uint8_t>(it->second);
      const bool restored = lane->comm()->load_state_agreed(bytes);
      if (it != in->end()) (*used)[lane->name()] = restored;
    }
  });
  if (unknown_lane) std::rethrow_exception(unknown_lane);
  return *used;
}

namespace {
std::atomic<bool> loss_scaled_in_process{false};
}  // namespace

void CompcollBackend::note_loss_scaled() { loss_scaled_in_process.store(true); }
bool CompcollBackend::loss_scaled() { return loss_scaled_in_process.load(); }

size_t CompcollBackend::rescale_state(double factor) {
  const auto f = static_cast<float>(factor);
  CC_CHECK(std::isfinite(f) && f > 0.0f, kInvalidArgument,
           "rescale_state: the loss-scale factor must be finite and > 0, got ", factor);
  if (finished_.load()) return 0;  // destroyed: it reduces nothing any more
  auto rescaled = std::make_shared<size_t>(0);
  worker_->run_and_wait("rescale_state", [rescaled, f, host = host_, device = device_] {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      // A failed lane refuses it and reduces nothing any more: skipped.
      if (lane != nullptr && lane->comm() != nullptr && !lane->comm()->broken()) {
        *rescaled += lane->comm()->rescale_state(f);
      }
    }
  });
  // Said once per group, on its rank 0: it is right, and happens at every
  // overflow and growth of the scale; the stats count them.
  if (loss_scale_changes_.fetch_add(1) == 0 && getRank() == 0) {
    log_.info("group '", getGroupUid(), "': the loss scale (torch.amp.GradScaler) changed by a "
              "factor of ", factor, ": its ", *rescaled, " error-feedback states hold scaled "
              "gradients and are rescaled with it, from the next call on (every later change "
              "does the same; compcoll.stats() counts them in loss_scale_changes)");
  } else {
    log_.trace("group '", getGroupUid(), "': loss scale x", factor, ", ", *rescaled,
               " error-feedback states rescaled");
  }
  return *rescaled;
}

}  // namespace compcoll::torch_integration
