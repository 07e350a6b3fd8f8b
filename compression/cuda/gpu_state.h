// Error-feedback state of one tensor on the device: the mirror of
// compression/codec.h's CodecState (residual v, momentum u, step count,
// sdagc's lambda), convertible both ways so that a run can move between the
// CPU and the GPU codecs (and tests can compare them).
#pragma once

#include <cstdint>

#include "compression/codec.h"
#include "compression/cuda/cuda_util.h"

namespace compcoll::cuda {

struct GpuState {
  size_t n = 0;
  DeviceBuffer<float> v;
  DeviceBuffer<float> u;  // empty when momentum is off
  uint64_t steps = 0;
  float lambda = 0.0f;

  // v (and u when with_momentum) zeroed, for an n-element tensor.
  static GpuState zeros(size_t n, bool with_momentum, cudaStream_t s);
  static GpuState from_host(const CodecState& host, cudaStream_t s);
  // host must have been made for the same n (and momentum).
  void to_host(CodecState& host, cudaStream_t s) const;

  float* u_or_null() { return u.size() ? u.data() : nullptr; }
  size_t memory_bytes() const { return v.bytes() + u.bytes(); }
};

}  // namespace compcoll::cuda
