#include <cub/cub.cuh>

#include "compression/cuda/device_math.h"
#include "compression/cuda/select_kernels.h"

namespace compcoll::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRounds = 16;  // a scan tile is kRounds rounds of kThreads consecutive elements
constexpr size_t kTile = size_t(kThreads) * kRounds;

unsigned grid_for(size_t n, size_t per_block = kThreads) {
  const size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(blocks < 65535 * 16 ? (blocks ? blocks : 1) : 65535 * 16);
}

template <int K>
__global__ void tile_count(const float* v, size_t n, float t, unsigned long long* counts) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const size_t base = size_t(blockIdx.x) * kTile;
  int c = 0;
  for (int r = 0; r < kRounds; ++r) {
    const size_t i = base + size_t(r) * kThreads + threadIdx.x;
    c += i < n && passes<K>(v[i], t);
  }
  const int total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Rounds in order, threads in order within a round: positions follow the
// index order, as the CPU's scan appends them.
template <int K>
__global__ void tile_write(const float* v, size_t n, float t, const unsigned long long* offsets,
                           size_t cap, uint32_t* out) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  unsigned long long pos = offsets[blockIdx.x];
  if (pos >= cap) return;  // the same for the whole block
  const size_t base = size_t(blockIdx.x) * kTile;
  for (int r = 0; r < kRounds; ++r) {
    const size_t i = base + size_t(r) * kThreads + threadIdx.x;
    const int flag = i < n && passes<K>(v[i], t);
    int before = 0, total = 0;
    Scan(tmp).ExclusiveSum(flag, before, total);
    if (flag && pos + before < cap) out[pos + before] = uint32_t(i);
    pos += total;
    __syncthreads();  // tmp is reused by the next round
  }
}

template <int K>
__global__ void gather_keys_kernel(const float* v, const uint32_t* idx, size_t k, float* out) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < k; j += size_t(gridDim.x) * blockDim.x) {
    out[j] = select_key<K>(v[idx[j]]);
  }
}

template <int K>
__global__ void all_keys_kernel(const float* v, size_t n, float* out, uint32_t* ids) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = select_key<K>(v[i]);
    ids[i] = uint32_t(i);
  }
}

__global__ void gather_values_kernel(const float* v, const uint32_t* idx, size_t k, float* out) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < k; j += size_t(gridDim.x) * blockDim.x) {
    out[j] = v[idx[j]];
  }
}

__global__ void count_at_least_kernel(const float* keys, size_t n, float t, unsigned long long* count) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  int c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    c += keys[i] >= t;
  }
  const int total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0 && total) atomicAdd(count, (unsigned long long)total);
}

template <typename Fn>
void with_key(int key, Fn&& fn) {
  switch (key) {
    case 0: return fn(std::integral_constant<int, 0>{});
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    default: return fn(std::integral_constant<int, 3>{});
  }
}

// cub's two-phase temporary storage protocol.
template <typename Call>
void run_cub(Temp& temp, cudaStream_t s, const char* what, Call&& call) {
  size_t bytes = 0;
  check(call(nullptr, bytes), what);
  temp.resize(bytes);
  check(call(temp.data(), bytes), what);
}

}  // namespace

void sort_desc(float* keys, float* alt, size_t n, Temp& temp, cudaStream_t s) {
  if (n < 2) return;
  cub::DoubleBuffer<float> db(keys, alt);
  run_cub(temp, s, "cub::DeviceRadixSort::SortKeysDescending", [&](void* t, size_t& b) {
    return cub::DeviceRadixSort::SortKeysDescending(t, b, db, int64_t(n), 0, 32, s);
  });
  if (db.Current() != keys) {
    check(cudaMemcpyAsync(keys, db.Current(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), "sort copy");
  }
}

void sort_u32(uint32_t* keys, uint32_t* alt, size_t n, Temp& temp, cudaStream_t s) {
  if (n < 2) return;
  cub::DoubleBuffer<uint32_t> db(keys, alt);
  run_cub(temp, s, "cub::DeviceRadixSort::SortKeys", [&](void* t, size_t& b) {
    return cub::DeviceRadixSort::SortKeys(t, b, db, int64_t(n), 0, 32, s);
  });
  if (db.Current() != keys) {
    check(cudaMemcpyAsync(keys, db.Current(), n * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s), "sort copy");
  }
}

void sort_pairs_desc(float* keys, float* keys_alt, uint32_t* vals, uint32_t* vals_alt, size_t n,
                     Temp& temp, cudaStream_t s) {
  if (n < 2) return;
  cub::DoubleBuffer<float> dk(keys, keys_alt);
  cub::DoubleBuffer<uint32_t> dv(vals, vals_alt);
  run_cub(temp, s, "cub::DeviceRadixSort::SortPairsDescending", [&](void* t, size_t& b) {
    return cub::DeviceRadixSort::SortPairsDescending(t, b, dk, dv, int64_t(n), 0, 32, s);
  });
  if (dk.Current() != keys) {
    check(cudaMemcpyAsync(keys, dk.Current(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), "sort copy");
  }
  if (dv.Current() != vals) {
    check(cudaMemcpyAsync(vals, dv.Current(), n * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s), "sort copy");
  }
}

void gather_keys(int key, const float* v, const uint32_t* idx, size_t k, float* out, cudaStream_t s) {
  if (k == 0) return;
  with_key(key, [&](auto kc) {
    gather_keys_kernel<decltype(kc)::value><<<grid_for(k), kThreads, 0, s>>>(v, idx, k, out);
  });
  check(cudaGetLastError(), "gather_keys");
}

void all_keys(int key, const float* v, size_t n, float* out, uint32_t* ids, cudaStream_t s) {
  if (n == 0) return;
  with_key(key, [&](auto kc) {
    all_keys_kernel<decltype(kc)::value><<<grid_for(n), kThreads, 0, s>>>(v, n, out, ids);
  });
  check(cudaGetLastError(), "all_keys");
}

void gather_values(const float* v, const uint32_t* idx, size_t k, float* out, cudaStream_t s) {
  if (k == 0) return;
  gather_values_kernel<<<grid_for(k), kThreads, 0, s>>>(v, idx, k, out);
  check(cudaGetLastError(), "gather_values");
}

size_t count_at_least(const float* keys, size_t n, float t, unsigned long long* scratch, cudaStream_t s) {
  if (n == 0) return 0;
  check(cudaMemsetAsync(scratch, 0, sizeof(unsigned long long), s), "cudaMemsetAsync");
  count_at_least_kernel<<<grid_for(n), kThreads, 0, s>>>(keys, n, t, scratch);
  check(cudaGetLastError(), "count_at_least");
  return size_t(read_one(scratch, s));
}

size_t ordered_scan(int key, const float* v, size_t n, float t, size_t cap, uint32_t* out,
                    DeviceBuffer<unsigned long long>& tile_counts, Temp& temp, cudaStream_t s) {
  if (n == 0) return 0;
  const size_t tiles = (n + kTile - 1) / kTile;
  tile_counts.resize(2 * tiles);
  unsigned long long* counts = tile_counts.data();
  unsigned long long* offsets = counts + tiles;
  with_key(key, [&](auto kc) {
    tile_count<decltype(kc)::value><<<unsigned(tiles), kThreads, 0, s>>>(v, n, t, counts);
  });
  check(cudaGetLastError(), "ordered_scan count");
  run_cub(temp, s, "cub::DeviceScan::ExclusiveSum", [&](void* tp, size_t& b) {
    return cub::DeviceScan::ExclusiveSum(tp, b, counts, offsets, int64_t(tiles), s);
  });
  if (cap > 0) {
    with_key(key, [&](auto kc) {
      tile_write<decltype(kc)::value><<<unsigned(tiles), kThreads, 0, s>>>(v, n, t, offsets, cap, out);
    });
    check(cudaGetLastError(), "ordered_scan write");
  }
  unsigned long long last[2];
  to_host(&last[0], counts + tiles - 1, 1, s);
  to_host(&last[1], offsets + tiles - 1, 1, s);
  return size_t(last[0] + last[1]);
}

}  // namespace compcoll::cuda::detail
