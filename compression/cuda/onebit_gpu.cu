#include <algorithm>
#include <bit>

#include "compression/cuda/device_math.h"
#include "compression/cuda/onebit_gpu.h"
#include "compression/non_finite.h"
#include "compression/payload.h"

namespace compcoll::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kTile = 2048;
constexpr int kMaxLog2Block = 24;  // onebit.cc's

__device__ __forceinline__ size_t first() { return blockIdx.x * size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t step() { return size_t(gridDim.x) * blockDim.x; }

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::clamp<size_t>(blocks, 1, 4096 * 32));
}

// Pass A, one CUDA block per scale block: e = x + err (left in err), the
// lane sums, and the scales, unless the block holds a non-finite value
// (then bad[b] counts them and pass B computes the scales).
__global__ void accumulate_kernel(const float* x, float* err, size_t n, size_t block, bool pair,
                                  float* scales, int32_t* bad, unsigned long long* total_bad) {
  __shared__ float tile[kTile];
  __shared__ float abs_lane[4], neg_lane[4];
  __shared__ int neg_count[4];
  __shared__ int bad_count;
  const size_t b = blockIdx.x;
  const size_t begin = b * block;
  const size_t len = n - begin < block ? n - begin : block;
  const size_t len4 = len - len % 4;
  if (threadIdx.x == 0) bad_count = 0;
  __syncthreads();
  float a_sum = 0.0f, n_sum = 0.0f;
  int n_cnt = 0;
  for (size_t t0 = 0; t0 < len; t0 += kTile) {
    const size_t tlen = len - t0 < kTile ? len - t0 : kTile;
    for (size_t j = threadIdx.x; j < tlen; j += blockDim.x) {
      const size_t i = begin + t0 + j;
      const float e = fadd(x[i], err[i]);
      err[i] = e;
      tile[j] = e;
      if (!finite(e)) atomicAdd(&bad_count, 1);
    }
    __syncthreads();
    if (threadIdx.x < 4) {
      for (size_t j = threadIdx.x; j < tlen && t0 + j < len4; j += 4) {
        const float a = abs_of(tile[j]);
        a_sum = fadd(a_sum, a);
        if (sign_of(tile[j])) {
          n_sum = fadd(n_sum, a);
          ++n_cnt;
        }
      }
    }
    __syncthreads();
  }
  if (threadIdx.x < 4) {
    abs_lane[threadIdx.x] = a_sum;
    neg_lane[threadIdx.x] = n_sum;
    neg_count[threadIdx.x] = n_cnt;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  bad[b] = bad_count;
  if (bad_count) {
    atomicAdd(total_bad, (unsigned long long)bad_count);
    return;
  }
  const OneBitScales s = onebit_scales(err + begin, len, abs_lane, neg_lane, neg_count, pair);
  scales[b * (pair ? 2 : 1)] = s.pos;
  if (pair) scales[b * 2 + 1] = s.neg;
}

// Pass B, blocks holding NaN or Inf only: the CPU's sequential sums over the
// finite values, the non-finite ones listed (at offsets[b], index order) and
// zeroed in err.
__global__ void bad_blocks_kernel(float* err, size_t n, size_t block, bool pair, float* scales,
                                  const int32_t* bad, const uint32_t* offsets, uint32_t* odd_idx,
                                  float* odd_val) {
  const size_t b = blockIdx.x;
  if (bad[b] == 0 || threadIdx.x != 0) return;
  const size_t begin = b * block;
  const size_t len = n - begin < block ? n - begin : block;
  float* e = err + begin;
  const OneBitScales s = onebit_scales_sequential(e, len, pair);
  uint32_t at = offsets[b];
  for (size_t j = 0; j < len; ++j) {
    if (finite(e[j])) continue;
    odd_idx[at] = uint32_t(begin + j);
    odd_val[at] = e[j];
    ++at;
    e[j] = 0.0f;
  }
  scales[b * (pair ? 2 : 1)] = s.pos;
  if (pair) scales[b * 2 + 1] = s.neg;
}

// Pass C, one thread per byte of sign bits: the bits of eight elements and
// err = e - D(Q(e)), clamped to +-bound x the block's larger scale as the
// CPU encoder does (onebit.h; bound 0: unbounded).
__global__ void quantize_kernel(float* err, size_t n, int log2_block, bool pair, const float* scales,
                                float bound, uint8_t* bits) {
  const size_t bytes = (n + 7) / 8;
  for (size_t q = first(); q < bytes; q += step()) {
    const size_t b = (q * 8) >> log2_block;
    const float pos = scales[b * (pair ? 2 : 1)];
    const float neg = pair ? scales[b * 2 + 1] : pos;
    const float lim = bound == 0.0f ? __int_as_float(0x7f800000) : __fmul_rn(bound, pos > neg ? pos : neg);
    uint32_t byte = 0;
    const size_t end = q * 8 + 8 < n ? q * 8 + 8 : n;
    for (size_t i = q * 8; i < end; ++i) {
      const bool negative = sign_of(err[i]);
      byte |= uint32_t(negative) << (i - q * 8);
      float r = fsub(err[i], negative ? -neg : pos);
      r = r > lim ? lim : r;
      err[i] = r < -lim ? -lim : r;
    }
    bits[q] = uint8_t(byte);
  }
}

__global__ void set_zero_kernel(float* err, const uint32_t* idx, size_t k) {
  for (size_t j = first(); j < k; j += step()) err[idx[j]] = 0.0f;
}

__global__ void decode_kernel(const float* scales, const uint8_t* bits, size_t n, int log2_block, bool pair,
                              bool accumulate, float* out) {
  for (size_t i = first(); i < n; i += step()) {
    const size_t b = i >> log2_block;
    const float pos = scales[b * (pair ? 2 : 1)];
    const float neg = pair ? -scales[b * 2 + 1] : -pos;
    const float val = (bits[i / 8] >> (i % 8)) & 1u ? neg : pos;
    out[i] = accumulate ? fadd(out[i], val) : val;
  }
}

__global__ void non_finite_kernel(const uint32_t* idx, const float* val, size_t k, bool accumulate, float* out) {
  for (size_t j = first(); j < k; j += step()) {
    out[idx[j]] = accumulate ? fadd(out[idx[j]], val[j]) : val[j];
  }
}

}  // namespace

OneBitGpu::OneBitGpu(const OneBitConfig& config) : config_(config) { validate_onebit_config(config); }

void OneBitGpu::encode(const float* d_x, float* d_err, size_t n, Bytes& out, cudaStream_t s) {
  const size_t blocks = (n + config_.block - 1) / config_.block;
  const bool pair = config_.scale == ScaleMode::kSignedMeans;
  const size_t scale_bytes = blocks * (pair ? 2 : 1) * sizeof(float);
  const size_t body = scale_bytes + (n + 7) / 8;
  out.resize(kPayloadHeaderBytes + body);
  write_header({PayloadFormat::kOneBit, static_cast<uint8_t>(config_.scale),
                static_cast<uint8_t>(std::countr_zero(config_.block)), n, blocks},
               out.data());
  body_.resize(body);
  bad_.resize(blocks);
  total_.resize(1);
  float* scales = reinterpret_cast<float*>(body_.data());
  uint8_t* bits = body_.data() + scale_bytes;
  check(cudaMemsetAsync(total_.data(), 0, sizeof(unsigned long long), s), "cudaMemsetAsync");
  if (blocks) {
    accumulate_kernel<<<unsigned(blocks), kThreads, 0, s>>>(d_x, d_err, n, config_.block, pair, scales,
                                                            bad_.data(), total_.data());
    check(cudaGetLastError(), "onebit accumulate");
  }
  const size_t odd_count = size_t(read_one(total_.data(), s));
  std::vector<NonFinite> odd(odd_count);
  if (odd_count) {
    // Offsets of each block's entries: a scan on the host (rare path).
    const std::vector<int32_t> bad = to_host(bad_.data(), blocks, s);
    std::vector<uint32_t> offsets(blocks);
    uint32_t at = 0;
    for (size_t b = 0; b < blocks; ++b) {
      offsets[b] = at;
      at += uint32_t(bad[b]);
    }
    offsets_.resize(blocks);
    odd_idx_.resize(odd_count);
    odd_val_.resize(odd_count);
    to_device(offsets_.data(), offsets.data(), blocks, s);
    bad_blocks_kernel<<<unsigned(blocks), 1, 0, s>>>(d_err, n, config_.block, pair, scales, bad_.data(),
                                                      offsets_.data(), odd_idx_.data(), odd_val_.data());
    check(cudaGetLastError(), "onebit bad blocks");
  }
  if (n) {
    quantize_kernel<<<grid_for((n + 7) / 8), kThreads, 0, s>>>(d_err, n, std::countr_zero(config_.block), pair,
                                                                scales, config_.residual_bound, bits);
    check(cudaGetLastError(), "onebit quantize");
  }
  if (odd_count) {
    // Sent exactly: the error memory restarts from zero there.
    set_zero_kernel<<<grid_for(odd_count), kThreads, 0, s>>>(d_err, odd_idx_.data(), odd_count);
    check(cudaGetLastError(), "onebit zero");
    const std::vector<uint32_t> idx = to_host(odd_idx_.data(), odd_count, s);
    const std::vector<float> val = to_host(odd_val_.data(), odd_count, s);
    for (size_t i = 0; i < odd_count; ++i) odd[i] = {idx[i], val[i]};
  }
  to_host(out.data() + kPayloadHeaderBytes, body_.data(), body, s);
  append_non_finite(out, odd);
}

void OneBitGpu::decode(std::span<const uint8_t> payload, float* d_out, size_t n, bool accumulate, cudaStream_t s) {
  // onebit_decode's checks, all before the first write.
  const PayloadHeader h = read_header(payload, PayloadFormat::kOneBit, n);
  CC_PAYLOAD_CHECK(h.aux0 <= static_cast<uint8_t>(ScaleMode::kSignedMeans), "onebit: unknown scale mode ",
                   int(h.aux0));
  CC_PAYLOAD_CHECK(h.aux1 >= 3 && h.aux1 <= kMaxLog2Block, "onebit: log2 block size ", int(h.aux1),
                   " outside [3, ", kMaxLog2Block, "]");
  const OneBitConfig c{size_t{1} << h.aux1, static_cast<ScaleMode>(h.aux0)};
  const size_t blocks = (n + c.block - 1) / c.block;
  CC_PAYLOAD_CHECK(h.k == blocks, "onebit: payload has ", h.k, " blocks, ", n, " elements in blocks of ",
                   c.block, " need ", blocks);
  const size_t fixed = onebit_payload_bytes(n, c) - non_finite_bytes(0);
  CC_PAYLOAD_CHECK(payload.size() >= fixed, "onebit: payload is ", payload.size(), " bytes, at least ",
                   fixed + non_finite_bytes(0), " expected");
  std::vector<NonFinite> odd;
  const size_t end = parse_non_finite(payload, fixed, n, odd);
  CC_PAYLOAD_CHECK(end == payload.size(), "onebit: ", payload.size() - end, " trailing bytes after the payload");

  const bool pair = c.scale == ScaleMode::kSignedMeans;
  const size_t body = fixed - kPayloadHeaderBytes;
  body_.resize(body);
  to_device(body_.data(), payload.data() + kPayloadHeaderBytes, body, s);
  const float* scales = reinterpret_cast<const float*>(body_.data());
  const uint8_t* bits = body_.data() + blocks * (pair ? 2 : 1) * sizeof(float);
  if (n) {
    decode_kernel<<<grid_for(n), kThreads, 0, s>>>(scales, bits, n, h.aux1, pair, accumulate, d_out);
    check(cudaGetLastError(), "onebit decode");
  }
  if (!odd.empty()) {
    std::vector<uint32_t> idx(odd.size());
    std::vector<float> val(odd.size());
    for (size_t i = 0; i < odd.size(); ++i) {
      idx[i] = odd[i].idx;
      val[i] = odd[i].value;
    }
    odd_idx_.resize(odd.size());
    odd_val_.resize(odd.size());
    to_device(odd_idx_.data(), idx.data(), idx.size(), s);
    to_device(odd_val_.data(), val.data(), val.size(), s);
    non_finite_kernel<<<grid_for(odd.size()), kThreads, 0, s>>>(odd_idx_.data(), odd_val_.data(), odd.size(),
                                                                 accumulate, d_out);
    check(cudaGetLastError(), "onebit non-finite");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace compcoll::cuda
