// SbcCodecGpu: compression/sbc.cc's encode with the passes on the device;
// the binarisation (binarise_sides: the means, summed in double in index
// order) and the payload (write_sbc_payload) run on the host, in the CPU
// codec's own functions.
#include <algorithm>
#include <cmath>

#include "compression/cuda/finalize.h"
#include "compression/cuda/sparse_gpu.h"
#include "compression/cuda/sparse_kernels.h"
#include "compression/golomb.h"
#include "compression/payload.h"

namespace compcoll::cuda {
namespace {

constexpr double kCandidateHeadroom = 1.2;  // sbc.cc's
// Non-finite entries collected by the fused pass before an ordered rescan
// is needed (a gradient with more is rare and costs one more pass).
constexpr size_t kOddCap = 1 << 16;

}  // namespace

SbcCodecGpu::SbcCodecGpu(const SbcConfig& config) : config_(config) {
  SbcCodec check_config(config);
  // The CPU codec's momentum correction has no GPU kernel yet: refuse it
  // rather than compute other math than the CPU path.
  CC_CHECK(config.momentum == 0.0f, kInvalidArgument,
           "sbc with COMPCOLL_MOMENTUM is not implemented for GPU tensors (the NCCL interposer)");
  detail::refuse_normalized_selection(config.second_moment_beta);
  if (config.runs_exact_warmup()) {
    warmup_ = std::make_unique<DgcCodecGpu>(sbc_warmup_config(config));
  }
}

GpuState SbcCodecGpu::make_state(size_t n, cudaStream_t s) const { return GpuState::zeros(n, false, s); }

EncodeInfo SbcCodecGpu::encode(const float* grad, size_t n, GpuState& st, Bytes& payload, cudaStream_t s) {
  CC_CHECK_EQ(st.n, n, kInvalidArgument, "sbc (GPU): state was made for another tensor size");
  // The CPU codec's exact warm-up (sbc.h): dgc on the same residual. No
  // momentum on this path, so no velocity to convert afterwards.
  if (warmup_ && st.steps < static_cast<uint64_t>(config_.warmup_steps)) {
    return warmup_->encode(grad, n, st, payload, s);
  }
  EncodeInfo info;
  info.density = warmup_density(config_.density, config_.warmup_steps, st.steps, config_.warmup_shape);
  info.wanted = target_count(info.density, n);
  float* v = st.v.data();
  pos_.bind(v, n, /*key=*/1, s);
  neg_.bind(v, n, /*key=*/2, s);

  // Both sides' thresholds from one strided sample of v + g.
  const detail::Strided at = detail::strided(n, config_.sample_fraction, st.steps);
  detail::sbc_sample(grad, v, at, pos_.sample(at.count), neg_.sample(at.count), s);
  pos_.sort_sample();
  neg_.sort_sample();
  const size_t side_k = sbc_side_count(info.wanted, config_.both_sides);
  const double pass_fraction =
      n ? std::min(1.0, kCandidateHeadroom * double(info.wanted) / double(n)) : 1.0;  // sbc.cc's
  float t_pos = pos_.sample_threshold(pass_fraction);
  float t_neg = neg_.sample_threshold(pass_fraction);

  const size_t cap = candidate_cap(info.wanted);
  counts_.resize(3);
  odd_.resize(kOddCap);
  check(cudaMemsetAsync(counts_.data(), 0, 3 * sizeof(unsigned long long), s), "cudaMemsetAsync");
  detail::SbcLists lists{pos_.candidates(cap), neg_.candidates(cap), odd_.data(), counts_.data(), cap, kOddCap};
  detail::sbc_fused(grad, v, n, t_pos, t_neg, lists, s);
  const std::vector<unsigned long long> counts = to_host(counts_.data(), 3, s);

  // Non-finite entries: sent exactly, in index order; the residual restarts.
  size_t odd_count = size_t(counts[2]);
  if (odd_count > kOddCap) {
    odd_.resize(odd_count);
    DeviceBuffer<unsigned long long> tiles;
    detail::Temp temp;
    odd_count = detail::ordered_scan(3, v, n, 0.0f, odd_count, odd_.data(), tiles, temp, s);
  } else {
    DeviceBuffer<uint32_t> alt(odd_count);
    detail::Temp temp;
    detail::sort_u32(odd_.data(), alt.data(), odd_count, temp, s);
  }
  std::vector<NonFinite> odd(odd_count);
  {
    const std::vector<uint32_t> idx = to_host(odd_.data(), odd_count, s);
    const std::vector<float> val = detail::values_at(v, odd_.data(), odd_count, values_, s);
    for (size_t i = 0; i < odd_count; ++i) odd[i] = {idx[i], val[i]};
  }
  detail::set_at(v, odd_.data(), odd_count, 0.0f, s);

  pos_.adopt(size_t(counts[0]), t_pos, cap);
  neg_.adopt(size_t(counts[1]), t_neg, cap);
  const SelectionTarget target{side_k, (side_k * 4 + 4) / 5, side_k};
  t_pos = finalize_selection_with(pos_, target, pass_fraction, t_pos, size_t(counts[0]));
  t_neg = finalize_selection_with(neg_, target, pass_fraction, t_neg, size_t(counts[1]));

  // Binarised on the host by the CPU codec's own function: the same bits.
  auto selection = [&](const GpuSelector& side) {
    return SbcSelection{side.selection_on_host(),
                        detail::values_at(v, side.selection(), side.held(), values_, s)};
  };
  SbcEntries sent = binarise_sides(selection(pos_), selection(neg_), config_.both_sides);
  sent.non_finite = std::move(odd);
  write_sbc_payload(sent, golomb_rice_parameter(n ? double(sent.idx.size()) / double(n) : 1.0), n,
                    payload);

  // v[i] -= the mean it was sent (no momentum on this path: u is null).
  const size_t k = sent.idx.size();
  std::vector<float> means(k);
  for (size_t j = 0; j < k; ++j) means[j] = sent.value(j);
  sent_idx_.resize(k);
  values_.resize(k);
  to_device(sent_idx_.data(), sent.idx.data(), k, s);
  to_device(values_.data(), means.data(), k, s);
  detail::sparse_residual(v, nullptr, sent_idx_.data(), values_.data(), k, /*masking=*/false, s);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  info.sent = k;
  info.threshold = sent.sides == kSbcNegativeSide ? -t_neg : t_pos;
  ++st.steps;
  return info;
}

}  // namespace compcoll::cuda
