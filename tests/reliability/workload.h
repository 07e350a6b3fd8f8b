// The reliability tests' workload: a sequence of collectives that every
// rank derives from one shared seed (same algorithm and element count on
// every rank, call after call), and per-rank inputs whose exact sum every
// rank can recompute without communication.
//
// Inputs are small integers held in floats (|x| <= 4), so any order of
// float additions over at most 2^21 ranks sums them exactly: a dense
// result, or a lossless compressed one, can be compared bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace compcoll::reliability {

// splitmix64: a stateless mix, so (seed, call, rank, ...) give independent
// streams without sharing generator state.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(mix(seed) | 1) {}
  uint64_t next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  // Uniform in [0, n).
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  double unit() { return static_cast<double>(next() >> 11) / 9007199254740992.0; }

 private:
  uint64_t s_;
};

struct CallSpec {
  size_t algo;   // index into the caller's list of algorithms
  size_t count;  // elements
  bool model;    // the long-lived "model" tensor (persistent error feedback)
};

// `calls` calls over `algos` algorithms. Counts: a quarter are the model
// tensor (model_count elements, state kept across calls), a quarter tiny
// (0..64, 0 included), half log-uniform in [1, max_count], so that every
// size class from one element to max_count is hit many times while the
// average call stays small enough for 1000 calls on a 2-core machine.
inline std::vector<CallSpec> make_sequence(uint64_t seed, size_t calls, size_t algos,
                                           size_t max_count, size_t model_count) {
  Rng rng(seed);
  std::vector<CallSpec> seq(calls);
  for (auto& c : seq) {
    c.algo = static_cast<size_t>(rng.below(algos));
    const uint64_t kind = rng.below(4);
    c.model = kind == 0;
    if (c.model) {
      c.count = model_count;
    } else if (kind == 1) {
      c.count = static_cast<size_t>(rng.below(65));
    } else {
      c.count = static_cast<size_t>(std::exp(rng.unit() * std::log(double(max_count) + 1.0)));
      if (c.count > max_count) c.count = max_count;
    }
  }
  return seq;
}

// Rank `rank`'s input of call `call`: integers in [-4, 4] as floats.
inline void fill_input(uint64_t seed, size_t call, int rank, float* out, size_t n) {
  Rng rng(mix(seed ^ mix(call * 1315423911ull + static_cast<uint64_t>(rank) + 1)));
  size_t i = 0;
  while (i < n) {
    uint64_t r = rng.next();
    for (int j = 0; j < 16 && i < n; ++j, ++i, r >>= 4) {
      out[i] = static_cast<float>(static_cast<int>(r % 9) - 4);
    }
  }
}

// The exact sum over `world` ranks of call `call`'s inputs.
inline std::vector<float> exact_sum(uint64_t seed, size_t call, int world, size_t n) {
  std::vector<float> sum(n, 0.0f), one(n);
  for (int r = 0; r < world; ++r) {
    fill_input(seed, call, r, one.data(), n);
    for (size_t i = 0; i < n; ++i) sum[i] += one[i];
  }
  return sum;
}

inline uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

inline bool bitwise_equal(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && (n == 0 || std::memcmp(a.data(), b, n * sizeof(float)) == 0);
}

}  // namespace compcoll::reliability
