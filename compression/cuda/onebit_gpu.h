// onebit (1-bit quantization with error feedback) on the GPU: the device
// version of compression/onebit.h's encode and decode.
//
// Bit-exact with the CPU, including the payload bytes: e = x + err, the
// per-block scales (each block's four float lanes summed in the CPU's order,
// then the scalar tail in double; a block holding NaN or Inf is summed
// sequentially in double, as the CPU does), the sign bits, the updated error
// and the non-finite list. NaN bit patterns may differ (see sparse_gpu.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compression/cuda/gpu_state.h"
#include "compression/onebit.h"

namespace compcoll::cuda {

class OneBitGpu {
 public:
  explicit OneBitGpu(const OneBitConfig& config);

  // e = x + err; out = Q(e) (host, overwritten; the CPU's payload bytes);
  // err = e - D(Q(e)). d_x and d_err hold n floats on the device.
  void encode(const float* d_x, float* d_err, size_t n, Bytes& out, cudaStream_t s);

  // d_out = D(payload) (or += when accumulate). The payload (host memory) is
  // validated entirely before anything is written; throws kMalformedPayload.
  void decode(std::span<const uint8_t> payload, float* d_out, size_t n, bool accumulate, cudaStream_t s);

 private:
  OneBitConfig config_;
  DeviceBuffer<uint8_t> body_;       // scales then sign bits
  DeviceBuffer<int32_t> bad_;        // non-finite count per block
  DeviceBuffer<uint32_t> offsets_;   // where each block's non-finite entries go
  DeviceBuffer<uint32_t> odd_idx_;
  DeviceBuffer<float> odd_val_;
  DeviceBuffer<unsigned long long> total_;
};

}  // namespace compcoll::cuda
