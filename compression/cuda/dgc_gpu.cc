// DgcCodecGpu: compression/dgc.cc's encode with the passes on the device.
#include <algorithm>

#include "compression/accumulate.h"
#include "compression/cuda/finalize.h"
#include "compression/cuda/sparse_gpu.h"
#include "compression/cuda/sparse_kernels.h"

namespace compcoll::cuda {
namespace {

constexpr double kCandidateHeadroom = 1.2;  // dgc.cc's

}  // namespace

DgcCodecGpu::DgcCodecGpu(const DgcConfig& config) : config_(config) {
  DgcCodec check_config(config);  // the CPU codec's validation
  detail::refuse_normalized_selection(config.second_moment_beta);
}

GpuState DgcCodecGpu::make_state(size_t n, cudaStream_t s) const {
  return GpuState::zeros(n, config_.momentum > 0.0f, s);
}

EncodeInfo DgcCodecGpu::encode(const float* grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) {
  CC_CHECK_EQ(st.n, n, kInvalidArgument, "dgc (GPU): state was made for another tensor size");
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps, config_.warmup_shape);
  info.wanted = target_count(info.density, n);
  const int mode = int(momentum_mode(config_.momentum, config_.nesterov));
  const float m = config_.momentum;
  const float scale = detail::clip_scale_gpu(grad, n, config_.clip, config_.world_size, partial_, s);
  float* u = st.u_or_null();
  float* v = st.v.data();
  sel_.bind(v, n, /*key=*/0, s);

  // Threshold from a strided sample of what |v| will be after this step.
  const detail::Strided at = detail::strided(n, config_.sample_fraction, st.steps);
  detail::dgc_sample(mode, grad, scale, m, u, v, at, sel_.sample(at.count), s);
  sel_.sort_sample();
  const double pass_fraction =
      n ? std::min(1.0, kCandidateHeadroom * double(info.wanted) / double(n)) : 1.0;
  const float t = sel_.sample_threshold(pass_fraction);

  const size_t cap = candidate_cap(info.wanted);
  sel_.reset_counter();
  detail::dgc_fused(mode, grad, scale, m, u, v, n, t, sel_.candidates(cap), cap, sel_.counter(), s);
  const size_t count = sel_.read_counter();
  sel_.adopt(count, t, cap);

  const SelectionTarget target{info.wanted, (info.wanted * 4 + 4) / 5, info.wanted};
  info.threshold = finalize_selection_with(sel_, target, pass_fraction, t, count);
  info.sent = sel_.held();
  detail::emit_sparse_gpu(sel_, st, n, config_.encoding, info.density <= config_.mask_density,
                          payload, values_, s);
  ++st.steps;
  return info;
}

}  // namespace compcoll::cuda
