#include "plugin/nccl_interposer/settings.h"

namespace compcoll::interposer {

Settings load_settings(const EnvLookup& env) {
  Settings s;
  s.config = load_config(env_read_by(FrontEnd::kNcclInterposer, env));
  s.config.front_end = FrontEnd::kNcclInterposer;
  s.config.stages_device_tensors = true;  // the staged path's host cores are idle
  s.nccl_library = s.config.nccl_library;
  s.cuda_library = s.config.cuda_library;
  return s;
}

}  // namespace compcoll::interposer
