// Compressed allreduces whose buffers stay in device memory: the seam through
// which the NCCL interposer runs the GPU codecs (collectives/cuda/) instead
// of staging every call through host memory. Plain C++ (no CUDA types), so
// the Communicator that routes calls to it builds without a CUDA toolkit.
//
// A route runs the same algorithm as the host path, with the same bits: the
// GPU codecs equal the CPU codecs bit for bit (docs/gpu.md), and decoding
// adds the ranks' payloads in rank order on the device as the CPU does. It
// keeps a tensor's error-feedback state in device memory as the CodecState's
// DeviceResidency; whatever reads the state on the host brings it back first
// (CodecState::bring_to_host).
#pragma once

#include <cstddef>
#include <string>

#include "collectives/comm.h"
#include "compcoll/types.h"
#include "compression/codec.h"

namespace compcoll {

struct CallInfo;

class DeviceRoute {
 public:
  virtual ~DeviceRoute() = default;
  // The stream later calls run on and are ordered with (a CUstream /
  // cudaStream_t); null is the device's default stream.
  virtual void set_stream(void* stream) = 0;
  // Why this call cannot run on the device ("" when it can): its dtype, or
  // buffers that are not device memory.
  virtual std::string refuses(const void* send, const void* recv, size_t count,
                              DType dtype) const = 0;
  // Collective: every rank calls it with the same count. recv = SUM (or AVG
  // when average) over the ranks of their send, through the algorithm;
  // send == recv is allowed. Returns once the result is in recv.
  virtual CallInfo allreduce(Comm& comm, const void* send, void* recv, size_t count, DType dtype,
                             bool average, CodecState& state) = 0;
};

}  // namespace compcoll
