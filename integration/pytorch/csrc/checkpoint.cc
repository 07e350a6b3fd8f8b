// Error-feedback checkpoints of a compcoll torch backend (compcoll.state_dict
// / compcoll.load_state_dict): each lane's Communicator saves and restores
// its own state (plugin/state_file.h), on the worker, so that nothing queued
// before runs concurrently with it and everything queued after sees the
// restored state.
//
// A lane whose Communicator does not exist yet (a device lane before its
// first candidate) cannot take state: making its Communicator is collective
// and happens at a point of the submission order every rank shares, which a
// load call is not. Its bytes are reported unused (False) and an INFO line
// says why.
#include <memory>

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
  for (const auto& [name, bytes] : lanes) (void)lane_named(name);
  auto in = std::make_shared<std::map<std::string, Bytes>>(lanes);
  auto used = std::make_shared<std::map<std::string, bool>>();
  worker_->run_and_wait("load_state_dict", [in, used, host = host_, device = device_,
                                            log = log_] {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      if (lane == nullptr) continue;
      const auto it = in->find(lane->name());
      if (it == in->end()) continue;
      if (lane->comm() == nullptr) {
        log.info("load_state_dict: the ", lane->name(), " lane has not reduced anything yet, so ",
                 "its checkpointed error-feedback state is not used (fresh start)");
        (*used)[lane->name()] = false;
        continue;
      }
      (*used)[lane->name()] = lane->comm()->load_state(it->second);
    }
  });
  return *used;
}

}  // namespace compcoll::torch_integration
