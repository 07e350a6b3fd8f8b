// The sparsifying codecs on the GPU: dgc, sdagc and sbc with the semantics
// of their CPU versions (compression/dgc.h, sdagc.h, sbc.h), the gradient
// and the error-feedback state in device memory.
//
// What equals the CPU codec, given the same gradient and state:
//   - bit for bit: the updated u and v, the sampled thresholds, the selected
//     indices (sampling, trimming to the exact top-k, rescans, the exact
//     fallback: finalize.h takes the CPU's decisions), the payload bytes,
//     sdagc's sigma and lambda, sbc's means and Golomb-Rice stream;
//   - within a bound: the local clipping factor when clip > 0 (the L2 norm is
//     summed in double in another order: relative error ~1e-16 on the norm,
//     so the float factor differs by at most one ulp, rarely);
//   - not the NaN payload bits: a NaN is sent as a NaN, but the GPU may
//     produce a different NaN bit pattern than the CPU.
// Payloads are assembled on the host by the CPU's own encoders (the k
// selected entries come back; Golomb-Rice coding stays on the host), so they
// decode with compression/decode.h and cuda::decode_accumulate_gpu alike.
//
// A codec object holds device scratch memory and serves one stream at a
// time; encode() returns when the payload is complete.
#pragma once

#include <cstdint>
#include <memory>

#include "compression/cuda/gpu_state.h"
#include "compression/cuda/selector.h"
#include "compression/cuda/sparse_kernels.h"
#include "compression/dgc.h"
#include "compression/non_finite.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"

namespace compcoll::cuda {

class SparseCodecGpu {
 public:
  virtual ~SparseCodecGpu() = default;
  virtual const char* name() const = 0;
  virtual GpuState make_state(size_t n, cudaStream_t s) const = 0;
  // Adds d_grad (n floats on the device) to the state, selects, writes the
  // payload (host memory, overwritten) and removes what was sent from the
  // state, exactly as the CPU codec's encode.
  virtual EncodeInfo encode(const float* d_grad, size_t n, GpuState& state, Bytes& payload,
                            cudaStream_t s) = 0;
};

class DgcCodecGpu final : public SparseCodecGpu {
 public:
  explicit DgcCodecGpu(const DgcConfig& config);
  const char* name() const override { return "dgc"; }
  GpuState make_state(size_t n, cudaStream_t s) const override;
  EncodeInfo encode(const float* d_grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) override;

 private:
  DgcConfig config_;
  GpuSelector sel_;
  DeviceBuffer<float> values_;
  DeviceBuffer<double> partial_;
};

class SdagcCodecGpu final : public SparseCodecGpu {
 public:
  explicit SdagcCodecGpu(const SdagcConfig& config);
  const char* name() const override { return "sdagc"; }
  GpuState make_state(size_t n, cudaStream_t s) const override;
  EncodeInfo encode(const float* d_grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) override;

 private:
  SdagcConfig config_;
  GpuSelector sel_;
  DeviceBuffer<float> values_, block_sum_, block_sq_, tail_;
  DeviceBuffer<double> partial_;
};

class SbcCodecGpu final : public SparseCodecGpu {
 public:
  explicit SbcCodecGpu(const SbcConfig& config);
  const char* name() const override { return "sbc"; }
  GpuState make_state(size_t n, cudaStream_t s) const override;
  EncodeInfo encode(const float* d_grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) override;

 private:
  SbcConfig config_;
  std::unique_ptr<DgcCodecGpu> warmup_;  // exact_warmup: the codec of the warm-up steps (sbc.h)
  GpuSelector pos_, neg_;
  DeviceBuffer<uint32_t> odd_, sent_idx_;
  DeviceBuffer<float> values_;
  DeviceBuffer<unsigned long long> counts_;
};

namespace detail {

// Shared by the codecs (sparse_common.cc).
Strided strided(size_t n, double fraction, uint64_t step);
// Normalized selection (COMPCOLL_SELECTION) has no GPU kernel yet: a beta
// above 0 is kInvalidArgument rather than a silent rank by magnitude where
// the CPU path would not.
void refuse_normalized_selection(float second_moment_beta);
// compression/accumulate.h's clip_scale with the norm summed on the device.
float clip_scale_gpu(const float* d_grad, size_t n, float clip, int world_size,
                     DeviceBuffer<double>& partial, cudaStream_t s);
// dgc.cc's emit_sparse: gathers the selected values, encodes them with the
// CPU's encode_sparse, and applies what was sent to v (and masks u when
// masking, as the CPU does at densities up to mask_density).
void emit_sparse_gpu(const GpuSelector& sel, GpuState& st, uint64_t n, SparseEncoding encoding,
                     bool masking, Bytes& payload, DeviceBuffer<float>& values, cudaStream_t s);
// Values at the selection's indices, on the host.
std::vector<float> values_at(const float* v, const uint32_t* idx, size_t k, DeviceBuffer<float>& scratch,
                             cudaStream_t s);

}  // namespace detail
}  // namespace compcoll::cuda
