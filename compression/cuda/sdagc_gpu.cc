// SdagcCodecGpu: compression/sdagc.cc's encode with the passes on the device.
// sigma is bit-exact: the device sums each 1024-element block in the CPU's
// lane order, the host adds the block sums (and the scalar tail) in the
// CPU's order, in double.
#include <algorithm>
#include <cmath>

#include "compression/accumulate.h"
#include "compression/cuda/finalize.h"
#include "compression/cuda/sparse_gpu.h"
#include "compression/cuda/sparse_kernels.h"
#include "compression/sdagc.h"

namespace compcoll::cuda {

SdagcCodecGpu::SdagcCodecGpu(const SdagcConfig& config) : config_(config) {
  SdagcCodec check_config(config);
  detail::refuse_normalized_selection(config.second_moment_beta);
}

GpuState SdagcCodecGpu::make_state(size_t n, cudaStream_t s) const {
  GpuState st = GpuState::zeros(n, config_.momentum > 0.0f, s);
  st.lambda = static_cast<float>(gaussian_two_sided_quantile(config_.density));
  return st;
}

EncodeInfo SdagcCodecGpu::encode(const float* grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) {
  CC_CHECK_EQ(st.n, n, kInvalidArgument, "sdagc (GPU): state was made for another tensor size");
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps, config_.warmup_shape);
  info.wanted = target_count(info.density, n);
  const int mode = int(momentum_mode(config_.momentum, config_.nesterov));
  const float scale = detail::clip_scale_gpu(grad, n, config_.clip, config_.world_size, partial_, s);
  float* v = st.v.data();

  // Pass 1: accumulate; moments in the CPU's order.
  const size_t blocks = detail::sdagc_blocks(n);
  block_sum_.resize(blocks);
  block_sq_.resize(blocks);
  tail_.resize(4);
  detail::sdagc_accumulate(mode, grad, scale, config_.momentum, st.u_or_null(), v, n, block_sum_.data(),
                           block_sq_.data(), tail_.data(), s);
  SdagcMoments mo;
  const std::vector<float> bs = to_host(block_sum_.data(), blocks, s);
  const std::vector<float> bq = to_host(block_sq_.data(), blocks, s);
  for (size_t b = 0; b < blocks; ++b) {
    mo.sum += bs[b];
    mo.sum_sq += bq[b];
  }
  for (const float vi : to_host(tail_.data(), n % 4, s)) {
    mo.sum += vi;
    mo.sum_sq += double(vi) * vi;
  }
  double sigma = sdagc_sigma(mo, n);
  if (!std::isfinite(sigma)) {
    // Rare (a NaN or Inf in v): the CPU's sequential pass over the finite values.
    const std::vector<float> host_v = to_host(v, n, s);
    SdagcMoments fm;
    size_t finite = 0;
    for (const float x : host_v) {
      if (!std::isfinite(x)) continue;
      fm.sum += x;
      fm.sum_sq += double(x) * x;
      ++finite;
    }
    sigma = sdagc_sigma(fm, finite);
  }
  float lambda = st.lambda;
  if (info.density != config_.density) {
    lambda = static_cast<float>(gaussian_two_sided_quantile(info.density));
  }
  const float t = std::max(static_cast<float>(lambda * sigma), kMinThreshold);

  // Pass 2: candidates in index order.
  sel_.bind(v, n, /*key=*/0, s);
  const size_t cap = candidate_cap(info.wanted);
  const size_t count = sel_.scan(t, cap);
  const SelectionTarget target{info.wanted, (info.wanted * 4 + 4) / 5, (info.wanted * 13 + 9) / 10};
  const double pass_fraction = n ? double(info.wanted) / double(n) : 1.0;
  if (count < target.low || count > sel_.held()) {
    const detail::Strided at = detail::strided(n, 0.01, st.steps);
    detail::magnitude_sample(v, at, sel_.sample(at.count), s);
    sel_.sort_sample();
  }
  info.threshold = finalize_selection_with(sel_, target, pass_fraction, t, count);
  info.sent = sel_.held();

  if (sigma > 0.0 && std::isfinite(sigma)) {
    const float kth = sel_.key_at_rank(info.wanted);
    const double at_k = kth > 0.0f && std::isfinite(kth) ? kth : info.threshold;
    const double next = kSdagcLambdaHeadroom * at_k / sigma;
    if (std::isfinite(next) && next > 0.0) st.lambda = static_cast<float>(next);
  }
  // key_at_rank reorders the selection by key: restore index order.
  sel_.sort_by_index();
  detail::emit_sparse_gpu(sel_, st, n, config_.encoding, info.density <= config_.mask_density,
                          payload, values_, s);
  ++st.steps;
  return info;
}

}  // namespace compcoll::cuda
