#include "compression/cuda/selector.h"

#include <algorithm>
#include <cmath>

#include "compression/select.h"

namespace compcoll::cuda {

void GpuSelector::bind(const float* v, size_t n, int key, cudaStream_t s) {
  v_ = v;
  n_ = n;
  key_ = key;
  s_ = s;
  held_ = 0;
  sample_n_ = 0;
}

float* GpuSelector::sample(size_t count) {
  sample_.resize(count);
  sample_alt_.resize(count);
  sample_n_ = count;
  return sample_.data();
}

void GpuSelector::sort_sample() { detail::sort_desc(sample_.data(), sample_alt_.data(), sample_n_, temp_, s_); }

uint32_t* GpuSelector::candidates(size_t cap) {
  cand_.resize(std::max<size_t>(cap, 1));
  return cand_.data();
}

unsigned long long* GpuSelector::counter() {
  counter_.resize(1);
  return counter_.data();
}

void GpuSelector::reset_counter() {
  check(cudaMemsetAsync(counter(), 0, sizeof(unsigned long long), s_), "cudaMemsetAsync");
}

size_t GpuSelector::read_counter() { return size_t(read_one(counter(), s_)); }

void GpuSelector::adopt(size_t count, float t, size_t cap) {
  held_ = std::min(count, cap);
  if (count > cap) scan(t, cap);  // keep the first `cap` in index order, as the CPU does
}

float GpuSelector::sample_threshold(double fraction) {
  if (sample_n_ == 0) return kMinThreshold;
  size_t want = size_t(std::ceil(fraction * double(sample_n_)));
  want = std::clamp<size_t>(want, 1, sample_n_);
  return std::max(read_one(sample_.data() + (want - 1), s_), kMinThreshold);
}

size_t GpuSelector::scan(float t, size_t cap) {
  cand_.resize(std::max<size_t>(cap, 1));
  const size_t count = detail::ordered_scan(key_, v_, n_, t, cap, cand_.data(), tiles_, temp_, s_);
  held_ = std::min(count, cap);
  return count;
}

void GpuSelector::sort_by_index() {
  cand_alt_.resize(held_);
  detail::sort_u32(cand_.data(), cand_alt_.data(), held_, temp_, s_);
}

void GpuSelector::rank_held() {
  sort_by_index();  // ties must come out in index order: the sort below is stable
  keys_.resize(held_);
  keys_alt_.resize(held_);
  cand_alt_.resize(held_);
  detail::gather_keys(key_, v_, cand_.data(), held_, keys_.data(), s_);
  detail::sort_pairs_desc(keys_.data(), keys_alt_.data(), cand_.data(), cand_alt_.data(), held_, temp_, s_);
}

void GpuSelector::keep_top_k(size_t k) {
  if (held_ == 0) return;
  rank_held();
  // Non-finite values (key +inf, ranked first) are kept even beyond k.
  const size_t infinite = detail::count_at_least(keys_.data(), held_, INFINITY, counter(), s_);
  k = std::max(k, infinite);
  held_ = std::min(held_, k);
  sort_by_index();
}

float GpuSelector::key_at_rank(size_t r) {
  if (r == 0 || held_ < r) return 0.0f;
  rank_held();
  return read_one(keys_.data() + (r - 1), s_);
}

float GpuSelector::exact_top_k(size_t k) {
  k = std::min(k, n_);
  held_ = 0;
  if (k == 0) return kMinThreshold;
  keys_.resize(n_);
  keys_alt_.resize(n_);
  cand_.resize(n_);
  cand_alt_.resize(n_);
  detail::all_keys(key_, v_, n_, keys_.data(), cand_.data(), s_);
  detail::sort_pairs_desc(keys_.data(), keys_alt_.data(), cand_.data(), cand_alt_.data(), n_, temp_, s_);
  const float t = std::max(read_one(keys_.data() + (k - 1), s_), kMinThreshold);
  if (std::isinf(t)) {
    held_ = detail::count_at_least(keys_.data(), n_, INFINITY, counter(), s_);  // every non-finite value
  } else {
    // The first k in (key desc, index asc) order, less keys below the
    // smallest threshold (zeros are never worth sending).
    held_ = detail::count_at_least(keys_.data(), k, t, counter(), s_);
  }
  sort_by_index();
  return t;
}

std::vector<uint32_t> GpuSelector::selection_on_host() const { return to_host(cand_.data(), held_, s_); }

}  // namespace compcoll::cuda
