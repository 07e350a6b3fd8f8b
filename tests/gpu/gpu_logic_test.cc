// What makes the CUDA codecs bit-exact, checked on the CPU (no GPU needed):
//   - finalize.h's control flow, driven by operations that work the way the
//     GPU's do (sorting, atomically collected candidates in any order), takes
//     exactly compression/select.cc's decisions;
//   - device_math.h's arithmetic, run in the order the kernels run it (lanes
//     of four, then the scalar tail), reproduces the CPU codecs' onebit
//     scales, csc chunk norms and sdagc sigma bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compression/csc.h"
#include "compression/cuda/device_math.h"
#include "compression/cuda/finalize.h"
#include "compression/onebit.h"
#include "compression/payload.h"
#include "compression/sdagc.h"
#include "compression/sparse_payload.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

using bench::GradientKind;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float key_of(SelectKey k, float x) {
  switch (k) {
    case SelectKey::kPositive: return select_key<SelectKey::kPositive>(x);
    case SelectKey::kNegative: return select_key<SelectKey::kNegative>(x);
    default: return select_key<SelectKey::kMagnitude>(x);
  }
}

// finalize.h's operations done the GPU's way (selector.cc) on the host.
class SortingOps {
 public:
  SortingOps(const float* v, size_t n, SelectKey key, std::vector<float> sample, uint32_t seed)
      : v_(v), n_(n), key_(key), sample_(std::move(sample)), rng_(seed) {
    std::stable_sort(sample_.begin(), sample_.end(), std::greater<float>());
  }
  // As GpuSelector::adopt after a fused pass: complete lists arrive in any order.
  size_t adopt(float t, size_t cap) {
    const size_t count = scan(t, cap);
    if (count <= cap) std::shuffle(cand_.begin(), cand_.end(), rng_);
    return count;
  }
  size_t held() const { return cand_.size(); }
  void clear() { cand_.clear(); }
  void sort_by_index() { std::sort(cand_.begin(), cand_.end()); }
  void keep_top_k(size_t k) {
    rank_held();
    size_t infinite = 0;
    for (uint32_t i : cand_) infinite += std::isinf(key_of(key_, v_[i]));
    cand_.resize(std::min(cand_.size(), std::max(k, infinite)));
    sort_by_index();
  }
  float key_at_rank(size_t r) {
    if (r == 0 || cand_.size() < r) return 0.0f;
    rank_held();
    return key_of(key_, v_[cand_[r - 1]]);
  }
  float exact_top_k(size_t k) {
    k = std::min(k, n_);
    cand_.clear();
    if (k == 0) return kMinThreshold;
    std::vector<uint32_t> all(n_);
    for (size_t i = 0; i < n_; ++i) all[i] = uint32_t(i);
    std::stable_sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) { return key_of(key_, v_[a]) > key_of(key_, v_[b]); });
    const float t = std::max(key_of(key_, v_[all[k - 1]]), kMinThreshold);
    const size_t limit = std::isinf(t) ? n_ : k;
    for (size_t j = 0; j < limit && key_of(key_, v_[all[j]]) >= t; ++j) cand_.push_back(all[j]);
    sort_by_index();
    return t;
  }
  float sample_threshold(double fraction) {
    if (sample_.empty()) return kMinThreshold;
    size_t want = size_t(std::ceil(fraction * double(sample_.size())));
    want = std::clamp<size_t>(want, 1, sample_.size());
    return std::max(sample_[want - 1], kMinThreshold);
  }
  size_t scan(float t, size_t cap) {
    cand_.clear();
    return scan_candidates(v_, n_, t, key_, cand_, cap);
  }
  const std::vector<uint32_t>& selection() const { return cand_; }

 private:
  void rank_held() {
    sort_by_index();
    std::stable_sort(cand_.begin(), cand_.end(),
                     [&](uint32_t a, uint32_t b) { return key_of(key_, v_[a]) > key_of(key_, v_[b]); });
  }
  const float* v_;
  size_t n_;
  SelectKey key_;
  std::vector<float> sample_;
  std::vector<uint32_t> cand_;
  std::mt19937 rng_;
};

struct Case {
  const char* name;
  std::vector<float> v;
  SelectKey key;
  size_t k;
  float t_factor;  // the starting threshold, times the sample's: far off forces rescans
};

void expect_same_selection(const Case& c) {
  const size_t n = c.v.size();
  const SamplePlan plan = SamplePlan::make(n, 0.01, 3);
  std::vector<float> sample;
  for (size_t i = plan.offset; i < n; i += plan.stride) sample.push_back(key_of(c.key, c.v[i]));
  const double pf = n ? std::min(1.0, 1.2 * double(c.k) / double(n)) : 1.0;
  std::vector<float> scratch = sample;
  const float t0 = sample_threshold(scratch, pf) * c.t_factor;
  const SelectionTarget target{c.k, (c.k * 4 + 4) / 5, c.k};
  const size_t cap = candidate_cap(c.k);

  std::vector<uint32_t> cpu;
  const size_t cpu_count = scan_candidates(c.v.data(), n, t0, c.key, cpu, cap);
  std::vector<float> cpu_sample = sample;
  const float cpu_t = finalize_selection(c.v.data(), n, target, c.key, cpu_sample, pf, t0, cpu_count, cpu);

  SortingOps ops(c.v.data(), n, c.key, sample, 7);
  const size_t count = ops.adopt(t0, cap);
  const float gpu_t = cuda::finalize_selection_with(ops, target, pf, t0, count);
  EXPECT_EQ(bits(gpu_t), bits(cpu_t)) << c.name << ": threshold " << gpu_t << " vs " << cpu_t;
  EXPECT_EQ(ops.selection(), cpu) << c.name << ": selections differ (" << ops.held() << " vs " << cpu.size() << ")";
}

TEST(GpuSelectionLogic, FinalizeTakesTheCpuDecisions) {
  const size_t n = 100000;
  std::vector<Case> cases;
  for (auto [kind, name] : {std::pair{GradientKind::kGaussian, "gaussian"}, std::pair{GradientKind::kStudentT3, "t3"},
                            std::pair{GradientKind::kMixedScale, "mixed"}}) {
    const auto g = bench::make_gradient(kind, n, 11);
    for (float f : {1.0f, 8.0f, 0.01f, 1e-6f}) {
      cases.push_back({name, g, SelectKey::kMagnitude, 100, f});
      cases.push_back({name, g, SelectKey::kPositive, 100, f});
      cases.push_back({name, g, SelectKey::kNegative, 100, f});
    }
    cases.push_back({name, g, SelectKey::kMagnitude, 5000, 1.0f});
  }
  auto odd = bench::make_gradient(GradientKind::kGaussian, n, 12);
  for (size_t i = 0; i < 40; ++i) odd[i * 2477] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
  cases.push_back({"non-finite", odd, SelectKey::kMagnitude, 100, 1.0f});
  cases.push_back({"non-finite beyond k", odd, SelectKey::kMagnitude, 10, 1.0f});
  cases.push_back({"ties everywhere", std::vector<float>(n, 0.5f), SelectKey::kMagnitude, 100, 1.0f});
  std::vector<float> sparse(n, 0.0f);
  for (size_t i = 0; i < 30; ++i) sparse[i * 1000 + 5] = float(i) - 15.0f;
  cases.push_back({"fewer non-zeros than k", sparse, SelectKey::kMagnitude, 100, 1.0f});
  cases.push_back({"k = 0", bench::make_gradient(GradientKind::kGaussian, 10, 1), SelectKey::kMagnitude, 0, 1.0f});
  cases.push_back({"tiny", bench::make_gradient(GradientKind::kGaussian, 10, 2), SelectKey::kMagnitude, 1, 1.0f});
  for (const Case& c : cases) expect_same_selection(c);
}

TEST(GpuSelectionLogic, RescanConstantsMatchTheCpu) {
  // Drive the CPU into its exact fallback and count the rescans it makes
  // before it: every value equal, so no threshold separates k of them.
  const std::vector<float> v(50000, 1.0f);
  Case c{"all equal", v, SelectKey::kMagnitude, 64, 1.0f};
  expect_same_selection(c);
  EXPECT_EQ(cuda::kMaxRescans, 6);
  EXPECT_EQ(cuda::kRescanHeadroom, 1.2);
}

// The kernels' order for onebit: lanes over len - len%4, then the tail.
std::vector<float> onebit_scales_gpu_order(const std::vector<float>& e, const OneBitConfig& c) {
  std::vector<float> out;
  const bool pair = c.scale == ScaleMode::kSignedMeans;
  for (size_t begin = 0; begin < e.size(); begin += c.block) {
    const size_t len = std::min(c.block, e.size() - begin);
    const size_t len4 = len - len % 4;
    const float* b = e.data() + begin;
    bool bad = false;
    for (size_t j = 0; j < len; ++j) bad = bad || !std::isfinite(b[j]);
    cuda::OneBitScales s;
    if (bad) {
      s = cuda::onebit_scales_sequential(b, len, pair);
    } else {
      float abs_l[4] = {}, neg_l[4] = {};
      int cnt[4] = {};
      for (int lane = 0; lane < 4; ++lane) {
        for (size_t j = lane; j < len4; j += 4) {
          abs_l[lane] = cuda::fadd(abs_l[lane], cuda::abs_of(b[j]));
          if (cuda::sign_of(b[j])) {
            neg_l[lane] = cuda::fadd(neg_l[lane], cuda::abs_of(b[j]));
            ++cnt[lane];
          }
        }
      }
      s = cuda::onebit_scales(b, len, abs_l, neg_l, cnt, pair);
    }
    out.push_back(s.pos);
    if (pair) out.push_back(s.neg);
  }
  return out;
}

TEST(GpuArithmeticOrder, OneBitScalesMatchTheCpuBitForBit) {
  for (size_t n : {size_t(8), size_t(2048), size_t(10007), size_t(100003)}) {
    for (ScaleMode mode : {ScaleMode::kMeanMagnitude, ScaleMode::kSignedMeans}) {
      for (size_t block : {size_t(8), size_t(256), size_t(2048)}) {
        const OneBitConfig c{block, mode};
        std::vector<float> x = bench::make_gradient(GradientKind::kStudentT3, n, n + block);
        std::vector<float> err = bench::make_gradient(GradientKind::kMixedScale, n, n * 3 + block);
        x[n / 2] = -0.0f;
        if (n > 1000) x[777] = NAN;  // one block takes the sequential path
        if (n > 20000) {
          // A block of huge finite values, whose float lane sums overflow:
          // the sequential double path too, on the CPU and in the kernel.
          for (size_t i = 8192; i < 8192 + 2048; ++i) x[i] = (i % 3 ? 1e36f : -1e36f);
        }
        std::vector<float> e(n);
        for (size_t i = 0; i < n; ++i) e[i] = cuda::fadd(x[i], err[i]);
        Bytes payload;
        onebit_encode(c, x.data(), err.data(), n, payload);
        const std::vector<float> want = onebit_scales_gpu_order(e, c);
        ASSERT_GE(payload.size(), kPayloadHeaderBytes + want.size() * 4);
        for (size_t j = 0; j < want.size(); ++j) {
          const float cpu = load_le<float>(payload.data() + kPayloadHeaderBytes + 4 * j);
          ASSERT_EQ(bits(want[j]), bits(cpu)) << "n " << n << " block " << block << " scale " << j;
        }
      }
    }
  }
}

TEST(GpuArithmeticOrder, CscNormsAndStateMatchTheCpuBitForBit) {
  for (size_t chunk : {size_t(7), size_t(1000), size_t(1003), size_t(16384)}) {
    for (int mode : {0, 1, 2}) {
      const size_t n = 50001;
      CscConfig c;
      c.chunk = chunk;
      c.momentum = mode ? 0.9f : 0.0f;
      c.nesterov = mode == 2;
      auto st = make_csc_state(c, n);
      const auto g0 = bench::make_gradient(GradientKind::kMixedScale, n, 5);
      const auto g1 = bench::make_gradient(GradientKind::kGaussian, n, 6);
      std::vector<float> v(n, 0.0f), u(n, 0.0f);
      std::vector<float> norms(csc_chunk_count(n, chunk));
      for (const auto* g : {&g0, &g1}) {
        csc_accumulate_norms(c, g->data(), n, *st, norms.data());
        for (size_t i = 0; i < n; ++i) {
          if (mode == 0) v[i] = cuda::fadd(v[i], cuda::momentum_step<0>((*g)[i], u[i], c.momentum));
          if (mode == 1) v[i] = cuda::fadd(v[i], cuda::momentum_step<1>((*g)[i], u[i], c.momentum));
          if (mode == 2) v[i] = cuda::fadd(v[i], cuda::momentum_step<2>((*g)[i], u[i], c.momentum));
        }
      }
      ASSERT_EQ(0, std::memcmp(v.data(), st->v.data(), n * 4)) << "v, chunk " << chunk << " mode " << mode;
      if (mode) {
        ASSERT_EQ(0, std::memcmp(u.data(), st->u.data(), n * 4)) << "u, mode " << mode;
      }
      for (size_t ch = 0; ch < norms.size(); ++ch) {
        const size_t c0 = ch * chunk, len = std::min(chunk, n - c0), len4 = len - len % 4;
        float lanes[4] = {};
        for (int lane = 0; lane < 4; ++lane) {
          for (size_t e = lane; e < len4; e += 4) lanes[lane] = cuda::fadd(lanes[lane], cuda::abs_of(v[c0 + e]));
        }
        float norm = cuda::lane_total(lanes);
        for (size_t e = len4; e < len; ++e) norm = cuda::fadd(norm, cuda::abs_of(v[c0 + e]));
        ASSERT_EQ(bits(norm), bits(norms[ch])) << "chunk size " << chunk << " chunk " << ch;
      }
    }
  }
}

// sdagc: sigma in the kernels' order (1024-element blocks of lanes, block
// sums added in double on the host, then the tail) gives the CPU's next
// lambda, which is 0.93 * (k-th largest |v|) / sigma.
TEST(GpuArithmeticOrder, SdagcSigmaMatchesTheCpuBitForBit) {
  for (size_t n : {size_t(100000), size_t(100003), size_t(5000)}) {
    SdagcConfig c;
    c.density = 0.01;
    SdagcCodec codec(c);
    auto st = codec.make_state(n);
    const auto g = bench::make_gradient(GradientKind::kStudentT3, n, n);
    Bytes payload;
    codec.encode(g.data(), n, *st, payload);
    // v after accumulation is g itself (zero state, no momentum).
    double sum = 0.0, sum_sq = 0.0;
    const size_t n4 = n - n % 4;
    for (size_t b0 = 0; b0 < n4; b0 += 1024) {
      float s[4] = {}, q[4] = {};
      for (size_t i = b0; i < std::min(n4, b0 + 1024); ++i) {
        s[i % 4] = cuda::fadd(s[i % 4], g[i]);
        q[i % 4] = cuda::fadd(q[i % 4], cuda::fmul(g[i], g[i]));
      }
      sum += cuda::lane_total(s);
      sum_sq += cuda::lane_total(q);
    }
    for (size_t i = n4; i < n; ++i) {
      sum += g[i];
      sum_sq += double(g[i]) * g[i];
    }
    const double mean = sum / double(n);
    const double sigma = std::sqrt(std::max(0.0, sum_sq / double(n) - mean * mean));
    const SparseEntries sent = decode_sparse(payload, n);
    std::vector<float> mags;
    for (float x : sent.values) mags.push_back(std::fabs(x));
    std::sort(mags.begin(), mags.end(), std::greater<float>());
    const size_t k = target_count(c.density, n);
    ASSERT_GE(mags.size(), k);
    const float lambda = static_cast<float>(0.93 * double(mags[k - 1]) / sigma);
    EXPECT_EQ(bits(lambda), bits(st->lambda)) << "n " << n << ": " << lambda << " vs " << st->lambda;
  }
}

}  // namespace
}  // namespace compcoll
