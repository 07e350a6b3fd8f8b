#include "integration/bench/gradients.h"

#include <cmath>
#include <random>

#include "compcoll/error.h"

namespace compcoll::bench {

GradientKind parse_gradient_kind(const std::string& s) {
  if (s == "gaussian") return GradientKind::kGaussian;
  if (s == "t3") return GradientKind::kStudentT3;
  if (s == "mixed") return GradientKind::kMixedScale;
  CC_THROW(kInvalidArgument, "gradient kind '", s, "' is not one of gaussian, t3, mixed");
}

const char* gradient_kind_name(GradientKind k) {
  switch (k) {
    case GradientKind::kGaussian: return "gaussian";
    case GradientKind::kStudentT3: return "t3";
    case GradientKind::kMixedScale: return "mixed";
  }
  return "unknown";
}

void fill_gradient(GradientKind kind, float* out, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind) {
    case GradientKind::kGaussian:
      for (size_t i = 0; i < n; ++i) out[i] = normal(rng);
      return;
    case GradientKind::kStudentT3: {
      std::student_t_distribution<float> t3(3.0f);
      for (size_t i = 0; i < n; ++i) out[i] = t3(rng);
      return;
    }
    case GradientKind::kMixedScale: {
      // "Layers" of 1000..100000 elements whose scales span 1e-4..1e1.
      std::uniform_int_distribution<size_t> len(1000, 100000);
      std::uniform_real_distribution<float> log_scale(-4.0f, 1.0f);
      for (size_t i = 0; i < n;) {
        const size_t end = std::min(n, i + len(rng));
        const float scale = std::pow(10.0f, log_scale(rng));
        for (; i < end; ++i) out[i] = scale * normal(rng);
      }
      return;
    }
  }
}

std::vector<float> make_gradient(GradientKind kind, size_t n, uint64_t seed) {
  std::vector<float> g(n);
  fill_gradient(kind, g.data(), n, seed);
  return g;
}

}  // namespace compcoll::bench
