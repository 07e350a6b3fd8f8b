// What the interposer reads from the environment: the COMPCOLL_* table
// (plugin/config.h, parsed once by load_config), including the two library
// paths only the interposer uses (COMPCOLL_NCCL_LIBRARY, COMPCOLL_CUDA_LIBRARY).
#pragma once

#include <string>

#include "plugin/config.h"

namespace compcoll::interposer {

struct Settings {
  Config config;
  // COMPCOLL_NCCL_LIBRARY: the real NCCL, dlopen'ed (RTLD_LOCAL). A bare
  // soname resolves to the libnccl.so.2 the application already loaded.
  std::string nccl_library = "libnccl.so.2";
  // COMPCOLL_CUDA_LIBRARY: the CUDA driver (the tests point it at a stand-in).
  std::string cuda_library = "libcuda.so.1";
};

// Throws kInvalidArgument (from load_config) on a bad COMPCOLL_* value.
Settings load_settings(const EnvLookup& env = process_env());

}  // namespace compcoll::interposer
