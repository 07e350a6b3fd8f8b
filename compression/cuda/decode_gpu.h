// Format-driven decoding into device memory: the GPU side of
// compression/decode.h. The payload arrives in host memory (from the Comm
// seam), is validated on the host by the CPU decoders' own checks before
// anything is written, and its k entries are then scatter-added on the
// device in payload order: d_out[i] + value, the CPU's arithmetic, so
// accumulating the ranks' payloads in rank order gives the CPU's bits.
#pragma once

#include <cstdint>
#include <span>

#include "compression/cuda/cuda_util.h"

namespace compcoll::cuda {

class GpuDecoder {
 public:
  // d_out[0..n) += the dense contribution of a sparse (dgc, sdagc) or sbc
  // payload. Throws kMalformedPayload (leaving d_out untouched).
  void accumulate(std::span<const uint8_t> payload, float* d_out, uint64_t n, cudaStream_t s);

 private:
  DeviceBuffer<uint32_t> idx_;
  DeviceBuffer<float> values_;
};

}  // namespace compcoll::cuda
