#include <cmath>

#include "compcoll/error.h"
#include "compression/cuda/sparse_gpu.h"
#include "compression/cuda/sparse_kernels.h"
#include "compression/select.h"
#include "compression/sparse_payload.h"

namespace compcoll::cuda::detail {

Strided strided(size_t n, double fraction, uint64_t step) {
  const SamplePlan plan = SamplePlan::make(n, fraction, step);
  // The CPU's "for (i = offset; i < n; i += stride)".
  const size_t count = n > plan.offset ? (n - plan.offset - 1) / plan.stride + 1 : 0;
  return {plan.offset, plan.stride, count};
}

void refuse_normalized_selection(float second_moment_beta) {
  CC_CHECK(second_moment_beta == 0.0f, kInvalidArgument,
           "COMPCOLL_SELECTION=normalized is not implemented for GPU tensors (the NCCL interposer)");
}

float clip_scale_gpu(const float* d_grad, size_t n, float clip, int world_size,
                     DeviceBuffer<double>& partial, cudaStream_t s) {
  if (!(clip > 0.0f) || n == 0) return 1.0f;
  const double limit = clip / std::sqrt(static_cast<double>(world_size < 1 ? 1 : world_size));
  partial.resize(1024);
  auto norm_of = [&](bool finite_only) {
    const size_t blocks = sum_squares(d_grad, n, partial.data(), s, finite_only);
    double sum = 0.0;
    for (const double p : to_host(partial.data(), blocks, s)) sum += p;
    return std::sqrt(sum);
  };
  double norm = norm_of(false);
  // As clip_scale: a non-finite element does not turn clipping off for the rest.
  if (!std::isfinite(norm)) norm = norm_of(true);
  if (!std::isfinite(norm) || norm <= limit) return 1.0f;
  return static_cast<float>(limit / norm);
}

std::vector<float> values_at(const float* v, const uint32_t* idx, size_t k, DeviceBuffer<float>& scratch,
                             cudaStream_t s) {
  scratch.resize(k);
  gather_values(v, idx, k, scratch.data(), s);
  return to_host(scratch.data(), k, s);
}

void emit_sparse_gpu(const GpuSelector& sel, GpuState& st, uint64_t n, SparseEncoding encoding,
                     bool masking, Bytes& payload, DeviceBuffer<float>& values, cudaStream_t s) {
  const size_t k = sel.held();
  const std::vector<uint32_t> idx = sel.selection_on_host();
  std::vector<float> vals = values_at(st.v.data(), sel.selection(), k, values, s);
  encode_sparse(idx, vals, n, encoding, payload);  // vals now hold what receivers decode
  to_device(values.data(), vals.data(), k, s);
  sparse_residual(st.v.data(), st.u_or_null(), sel.selection(), values.data(), k, masking, s);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace compcoll::cuda::detail
