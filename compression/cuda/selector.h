// GpuSelector: one side's selection on the device, the operations
// finalize_selection_with (finalize.h) drives. It holds the sorted threshold
// sample and the candidate list of one key (magnitude, or one of sbc's
// sides) over one tensor v (device memory).
//
//   sample    the codec fills sample(ms) with keys and calls sort_sample();
//             thresholds are then order statistics read from the sorted
//             copy (the CPU finds the same values with nth_element).
//   candidates a fused pass appends indices (any order, atomics) to
//             candidates(cap) and counts passes in counter(); adopt() takes
//             the result, rescanning in index order when the pass overflowed
//             (the CPU keeps the first `cap` in index order, and later steps
//             depend on which it kept).
//   selection after finalize: held() indices, sorted ascending, on device.
#pragma once

#include <cstdint>
#include <vector>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda/select_kernels.h"

namespace compcoll::cuda {

class GpuSelector {
 public:
  // key: 0 magnitude, 1 positive side, 2 negative side.
  void bind(const float* v, size_t n, int key, cudaStream_t s);

  float* sample(size_t count);
  void sort_sample();

  uint32_t* candidates(size_t cap);
  unsigned long long* counter();
  void reset_counter();
  size_t read_counter();
  // count: passes the fused pass counted at threshold t.
  void adopt(size_t count, float t, size_t cap);

  // finalize_selection_with's operations.
  size_t held() const { return held_; }
  void clear() { held_ = 0; }
  void keep_top_k(size_t k);
  void sort_by_index();
  float exact_top_k(size_t k);
  float key_at_rank(size_t r);
  float sample_threshold(double fraction);
  size_t scan(float t, size_t cap);

  const uint32_t* selection() const { return cand_.data(); }
  std::vector<uint32_t> selection_on_host() const;

 private:
  // Sorts held candidates by key descending, ties by ascending index, into
  // cand_ (with their keys in keys_).
  void rank_held();

  const float* v_ = nullptr;
  size_t n_ = 0;
  int key_ = 0;
  cudaStream_t s_ = nullptr;
  size_t sample_n_ = 0;
  size_t held_ = 0;
  DeviceBuffer<float> sample_, sample_alt_, keys_, keys_alt_;
  DeviceBuffer<uint32_t> cand_, cand_alt_;
  DeviceBuffer<unsigned long long> counter_, tiles_;
  detail::Temp temp_;
};

}  // namespace compcoll::cuda
