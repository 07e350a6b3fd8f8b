// Device primitives of the selection (select_kernels.cu, the one file that
// includes cub): sorting, key gathering, counting and the ordered candidate
// scan. Keys: 0 magnitude, 1 positive side, 2 negative side, 3 non-finite
// (device_math.h). All of them run on `s`; the ones returning a count wait
// for it.
#pragma once

#include <cstdint>

#include "compression/cuda/cuda_util.h"

namespace compcoll::cuda::detail {

using Temp = DeviceBuffer<uint8_t>;

// Sorts keys[0, n) descending (-0 == +0; stable); alt holds n floats.
void sort_desc(float* keys, float* alt, size_t n, Temp& temp, cudaStream_t s);
// Sorts keys[0, n) ascending; alt holds n values.
void sort_u32(uint32_t* keys, uint32_t* alt, size_t n, Temp& temp, cudaStream_t s);
// Stable sort of (keys, vals) by key descending: equal keys keep their order.
void sort_pairs_desc(float* keys, float* keys_alt, uint32_t* vals, uint32_t* vals_alt, size_t n,
                     Temp& temp, cudaStream_t s);

// out[j] = key(v[idx[j]]).
void gather_keys(int key, const float* v, const uint32_t* idx, size_t k, float* out, cudaStream_t s);
// out[i] = key(v[i]) and ids[i] = i over the whole tensor.
void all_keys(int key, const float* v, size_t n, float* out, uint32_t* ids, cudaStream_t s);
// out[j] = v[idx[j]].
void gather_values(const float* v, const uint32_t* idx, size_t k, float* out, cudaStream_t s);
// How many of keys[0, n) are >= t (equal to +inf when t is +inf). Waits.
size_t count_at_least(const float* keys, size_t n, float t, unsigned long long* scratch,
                      cudaStream_t s);

// The first `cap` indices (in index order) whose key passes t, into out;
// returns how many pass in all. Waits. tile_counts is scratch.
size_t ordered_scan(int key, const float* v, size_t n, float t, size_t cap, uint32_t* out,
                    DeviceBuffer<unsigned long long>& tile_counts, Temp& temp, cudaStream_t s);

}  // namespace compcoll::cuda::detail
