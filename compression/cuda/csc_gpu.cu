#include <algorithm>

#include "compression/cuda/csc_gpu.h"
#include "compression/cuda/device_math.h"

namespace compcoll::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kTile = 2048;  // a multiple of 4: lanes keep their meaning across tiles

__device__ __forceinline__ size_t first() { return blockIdx.x * size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t step() { return size_t(gridDim.x) * blockDim.x; }

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::clamp<size_t>(blocks, 1, 4096 * 32));
}

// One CUDA block per chunk: every thread updates elements of a tile, four
// threads then add |v| lane by lane in the CPU's order.
template <int M>
__global__ void norms_kernel(const float* g, float m, float* u, float* v, size_t n, size_t chunk, float* norms) {
  __shared__ float mags[kTile];
  __shared__ float lanes[4];
  const size_t c0 = size_t(blockIdx.x) * chunk;
  const size_t len = n - c0 < chunk ? n - c0 : chunk;
  const size_t len4 = len - len % 4;
  float lane = 0.0f;
  for (size_t t0 = 0; t0 < len; t0 += kTile) {
    const size_t tlen = len - t0 < kTile ? len - t0 : kTile;
    for (size_t e = threadIdx.x; e < tlen; e += blockDim.x) {
      const size_t i = c0 + t0 + e;
      float ui = M == 0 ? 0.0f : u[i];
      const float x = fadd(v[i], momentum_step<M>(g[i], ui, m));
      if (M != 0) u[i] = ui;
      v[i] = x;
      mags[e] = abs_of(x);
    }
    __syncthreads();
    if (threadIdx.x < 4) {
      for (size_t e = threadIdx.x; e < tlen && t0 + e < len4; e += 4) lane = fadd(lane, mags[e]);
    }
    __syncthreads();
  }
  if (threadIdx.x < 4) lanes[threadIdx.x] = lane;
  __syncthreads();
  if (threadIdx.x == 0) {
    float norm = lane_total(lanes);
    for (size_t e = len4; e < len; ++e) norm = fadd(norm, abs_of(v[c0 + e]));
    norms[blockIdx.x] = norm;
  }
}

__global__ void pack_kernel(const float* v, const uint32_t* chunks, size_t chunk, size_t total, float* packed) {
  for (size_t p = first(); p < total; p += step()) {
    const size_t j = p / chunk;
    packed[p] = v[size_t(chunks[j]) * chunk + (p - j * chunk)];
  }
}

// csc_commit's: u is zeroed with v when masking; otherwise only where v or u
// is not finite (a non-finite value was sent; its velocity restarts).
__global__ void commit_kernel(float* v, float* u, const uint32_t* chunks, size_t chunk, size_t total,
                              bool masking) {
  for (size_t p = first(); p < total; p += step()) {
    const size_t j = p / chunk;
    const size_t i = size_t(chunks[j]) * chunk + (p - j * chunk);
    if (u != nullptr && (masking || !finite(v[i]) || !finite(u[i]))) u[i] = 0.0f;
    v[i] = 0.0f;
  }
}

__global__ void unpack_kernel(const float* packed, const int32_t* slot, size_t chunk, size_t n, float* out) {
  for (size_t i = first(); i < n; i += step()) {
    const size_t c = i / chunk;
    const int32_t j = slot[c];
    out[i] = j < 0 ? 0.0f : packed[size_t(j) * chunk + (i - c * chunk)];
  }
}

// Floats the selected chunks hold: only the last chunk of the tensor may be
// short, and it is the last of a sorted selection.
size_t packed_count(const std::vector<uint32_t>& chunks, size_t chunk, size_t n) {
  size_t total = 0;
  for (uint32_t c : chunks) total += std::min(chunk, n - size_t(c) * chunk);
  return total;
}

}  // namespace

CscGpu::CscGpu(const CscConfig& config) : config_(config) { validate_csc_config(config); }

GpuState CscGpu::make_state(size_t n, cudaStream_t s) const {
  return GpuState::zeros(n, config_.momentum > 0.0f, s);
}

void CscGpu::accumulate_norms(const float* d_grad, size_t n, GpuState& st, float* d_norms, cudaStream_t s) {
  CC_CHECK_EQ(st.n, n, kInvalidArgument, "csc (GPU): state was made for another tensor size");
  const size_t chunks = csc_chunk_count(n, config_.chunk);
  const int mode = config_.momentum == 0.0f ? 0 : config_.nesterov ? 2 : 1;
  if (chunks > 0) {
    float* u = st.u_or_null();
    const unsigned grid = unsigned(chunks);
    if (mode == 0) norms_kernel<0><<<grid, kThreads, 0, s>>>(d_grad, config_.momentum, u, st.v.data(), n, config_.chunk, d_norms);
    if (mode == 1) norms_kernel<1><<<grid, kThreads, 0, s>>>(d_grad, config_.momentum, u, st.v.data(), n, config_.chunk, d_norms);
    if (mode == 2) norms_kernel<2><<<grid, kThreads, 0, s>>>(d_grad, config_.momentum, u, st.v.data(), n, config_.chunk, d_norms);
    check(cudaGetLastError(), "csc norms");
  }
  ++st.steps;
}

size_t CscGpu::upload(const std::vector<uint32_t>& chunks, size_t n, cudaStream_t s) {
  const size_t count = csc_chunk_count(n, config_.chunk);
  for (size_t j = 0; j < chunks.size(); ++j) {
    CC_CHECK(chunks[j] < count && (j == 0 || chunks[j] > chunks[j - 1]), kInvalidArgument,
             "csc (GPU): chunk list must be increasing and below ", count);
  }
  chunks_.resize(chunks.size());
  to_device(chunks_.data(), chunks.data(), chunks.size(), s);
  return packed_count(chunks, config_.chunk, n);
}

size_t CscGpu::pack(const GpuState& st, const std::vector<uint32_t>& chunks, float* d_packed, cudaStream_t s) {
  const size_t total = upload(chunks, st.n, s);
  if (total) pack_kernel<<<grid_for(total), kThreads, 0, s>>>(st.v.data(), chunks_.data(), config_.chunk, total, d_packed);
  check(cudaGetLastError(), "csc pack");
  return total;
}

void CscGpu::commit(GpuState& st, const std::vector<uint32_t>& chunks, bool masking, cudaStream_t s) {
  const size_t total = upload(chunks, st.n, s);
  if (total) {
    commit_kernel<<<grid_for(total), kThreads, 0, s>>>(st.v.data(), st.u_or_null(), chunks_.data(),
                                                        config_.chunk, total, masking);
  }
  check(cudaGetLastError(), "csc commit");
}

void CscGpu::unpack(const float* d_packed, const std::vector<uint32_t>& chunks, size_t n, float* d_out,
                    cudaStream_t s) {
  upload(chunks, n, s);
  std::vector<int32_t> slot(csc_chunk_count(n, config_.chunk), -1);
  for (size_t j = 0; j < chunks.size(); ++j) slot[chunks[j]] = int32_t(j);
  slot_.resize(slot.size());
  to_device(slot_.data(), slot.data(), slot.size(), s);
  if (n) unpack_kernel<<<grid_for(n), kThreads, 0, s>>>(d_packed, slot_.data(), config_.chunk, n, d_out);
  check(cudaGetLastError(), "csc unpack");
}

}  // namespace compcoll::cuda
