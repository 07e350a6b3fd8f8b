// Test helpers around the stand-in libnccl.so.2 / libcuda.so.1: loading them
// the way the interposer does and running ranks as threads over them.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/interposer/process.h"
#include "transport/nccl/nccl_api.h"
#include "transport/nccl/nccl_comm.h"

namespace compcoll::testing {

// Paths baked in by CMake.
std::string standin_nccl_path();
std::string standin_cuda_path();
std::string interposer_path();
std::string app_path();

// The stand-ins, loaded once per process (dlopen by path, as the interposer does).
const nccl::NcclApi& standin_nccl();
const nccl::CudaDriverApi& standin_cuda();

// Runs fn on `ranks` threads, each with an NcclComm over its own stand-in
// communicator. Returns each rank's error message ("" when it succeeded).
// The communicators are destroyed afterwards (unless the NcclComm aborted).
// stop: NcclCommOptions::stop of every rank's NcclComm.
std::vector<std::string> run_nccl_ranks(int ranks, std::chrono::milliseconds timeout,
                                        const std::function<void(nccl::NcclComm&)>& fn,
                                        const std::atomic<bool>* stop = nullptr);

}  // namespace compcoll::testing
