#include <algorithm>
#include <vector>

#include "compression/cuda/decode_gpu.h"
#include "compression/cuda/device_math.h"
#include "compression/payload.h"
#include "compression/sbc.h"
#include "compression/sparse_payload.h"

namespace compcoll::cuda {
namespace {

constexpr int kThreads = 256;

// Distinct indices (the encoders' are strictly increasing): in parallel.
__global__ void scatter_add_kernel(const uint32_t* idx, const float* values, float value, size_t k, float* out) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < k; j += size_t(gridDim.x) * blockDim.x) {
    out[idx[j]] = fadd(out[idx[j]], values ? values[j] : value);
  }
}

// A valid but unusual payload that repeats an index: one thread, in order.
__global__ void scatter_add_serial_kernel(const uint32_t* idx, const float* values, size_t k, float* out) {
  for (size_t j = 0; j < k; ++j) out[idx[j]] = fadd(out[idx[j]], values[j]);
}

unsigned grid_for(size_t n) {
  return unsigned(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, 4096 * 32));
}

}  // namespace

void GpuDecoder::accumulate(std::span<const uint8_t> payload, float* d_out, uint64_t n, cudaStream_t s) {
  std::vector<uint32_t> idx;
  std::vector<float> values;
  float mean = 0.0f;
  std::vector<NonFinite> odd;
  switch (peek_format(payload)) {
    case PayloadFormat::kSparse: {
      SparseEntries e = decode_sparse(payload, n);  // validates everything
      idx = std::move(e.idx);
      values = std::move(e.values);
      break;
    }
    case PayloadFormat::kSbc: {
      SbcEntries e = decode_sbc(payload, n);
      if (e.sides == kSbcBothSides) {  // two means: one value per position
        values.resize(e.idx.size());
        for (size_t j = 0; j < e.idx.size(); ++j) values[j] = e.value(j);
      } else {
        mean = e.means[0];
      }
      idx = std::move(e.idx);
      odd = std::move(e.non_finite);
      break;
    }
    default:
      CC_THROW(kMalformedPayload, "payload format ", int(payload[3]),
               " cannot be accumulated as a sparse contribution");
  }
  const size_t k = idx.size();
  idx_.resize(k + odd.size());
  values_.resize(std::max(values.size(), odd.size()));
  to_device(idx_.data(), idx.data(), k, s);
  if (!values.empty()) {
    to_device(values_.data(), values.data(), k, s);
    const bool distinct = std::adjacent_find(idx.begin(), idx.end(), std::greater_equal<uint32_t>()) == idx.end();
    if (distinct) scatter_add_kernel<<<grid_for(k), kThreads, 0, s>>>(idx_.data(), values_.data(), 0.0f, k, d_out);
    else scatter_add_serial_kernel<<<1, 1, 0, s>>>(idx_.data(), values_.data(), k, d_out);
  } else if (k) {
    scatter_add_kernel<<<grid_for(k), kThreads, 0, s>>>(idx_.data(), nullptr, mean, k, d_out);
  }
  check(cudaGetLastError(), "decode scatter");
  if (!odd.empty()) {
    // sbc's exact values, after the mean (decode_sbc_accumulate's order).
    std::vector<uint32_t> oi(odd.size());
    std::vector<float> ov(odd.size());
    for (size_t i = 0; i < odd.size(); ++i) {
      oi[i] = odd[i].idx;
      ov[i] = odd[i].value;
    }
    to_device(idx_.data() + k, oi.data(), oi.size(), s);
    to_device(values_.data(), ov.data(), ov.size(), s);
    scatter_add_kernel<<<grid_for(oi.size()), kThreads, 0, s>>>(idx_.data() + k, values_.data(), 0.0f,
                                                                oi.size(), d_out);
    check(cudaGetLastError(), "decode non-finite");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace compcoll::cuda
