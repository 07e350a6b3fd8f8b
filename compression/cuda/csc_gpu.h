// csc (coarse-grained chunk sparsification) on the GPU: the device steps of
// compression/csc.h. The chunk selection itself (csc_select_chunks, on the
// allreduced norm vector of a few thousand floats) stays on the host.
//
// Bit-exact with the CPU: the accumulated v and u, and the chunk L1 norms
// (each chunk's four float lanes summed in the CPU's order, then its scalar
// tail); pack, commit and unpack are copies.
#pragma once

#include <cstdint>
#include <vector>

#include "compression/csc.h"
#include "compression/cuda/gpu_state.h"

namespace compcoll::cuda {

class CscGpu {
 public:
  explicit CscGpu(const CscConfig& config);
  GpuState make_state(size_t n, cudaStream_t s) const;

  // v += (momentum-corrected) grad; d_norms[c] = L1 norm of chunk c of v
  // (csc_chunk_count(n, chunk) floats on the device). Counts a step.
  void accumulate_norms(const float* d_grad, size_t n, GpuState& st, float* d_norms, cudaStream_t s);
  // The selected chunks of v back to back into d_packed; returns the number
  // of floats written (csc_pack's size).
  size_t pack(const GpuState& st, const std::vector<uint32_t>& chunks, float* d_packed, cudaStream_t s);
  // Zeroes v in the selected chunks, what was sent leaving the residual, and
  // u with it when masking (csc_commit's momentum factor masking; the
  // collective passes CscConfig::masking, or its warm-up's choice).
  void commit(GpuState& st, const std::vector<uint32_t>& chunks, bool masking, cudaStream_t s);
  // d_out = 0 except the selected chunks, which take the packed values.
  void unpack(const float* d_packed, const std::vector<uint32_t>& chunks, size_t n, float* d_out,
              cudaStream_t s);

 private:
  size_t upload(const std::vector<uint32_t>& chunks, size_t n, cudaStream_t s);

  CscConfig config_;
  DeviceBuffer<uint32_t> chunks_;
  DeviceBuffer<int32_t> slot_;  // chunk -> position among the selected, -1 if not selected
};

}  // namespace compcoll::cuda
