// The allgather pattern of the sparse allreduce (collectives/sparse_allgather.h)
// on device memory: the GPU codec encodes the caller's gradient where it lies,
// with the tensor's error-feedback state in device memory; only the payload
// (the k selected entries, coded by the CPU's own encoders) reaches the host
// and the Comm; every rank's payload is then scatter-added into the result
// on the device, in rank order. The same bits as the host path (the GPU
// codecs and decoder equal the CPU's; docs/gpu.md), without copying the
// tensor through host memory and without the CPU codec.
//
// fp16 and bf16 tensors run through an fp32 copy on the device, with fp32
// residuals, as on the host. dgc, sdagc and sbc; normalized selection
// (COMPCOLL_SELECTION) has no GPU kernel, so such a configuration gets no
// route (make_gpu_sparse_route says why).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "collectives/algorithm.h"
#include "collectives/device_route.h"

namespace compcoll::cuda {

struct GpuRouteChoice {
  std::unique_ptr<DeviceRoute> route;  // null when there is none; then:
  std::string why;                     // why not, for the log
};

// The device route of COMPCOLL_ALGO=algo with params, where this process has
// a CUDA device and the configuration has GPU codecs.
GpuRouteChoice make_gpu_sparse_route(std::string_view algo, const AlgoParams& params);

}  // namespace compcoll::cuda
