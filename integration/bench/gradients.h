// Synthetic gradients for the benchmark and the tests: Gaussian, heavy-tailed
// (Student t with 3 degrees of freedom) and mixed-scale (layers whose scales
// differ by orders of magnitude, as real networks' do).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace compcoll::bench {

enum class GradientKind { kGaussian, kStudentT3, kMixedScale };

GradientKind parse_gradient_kind(const std::string& s);  // gaussian | t3 | mixed
const char* gradient_kind_name(GradientKind k);

// n floats from a deterministic generator seeded with seed.
std::vector<float> make_gradient(GradientKind kind, size_t n, uint64_t seed);
void fill_gradient(GradientKind kind, float* out, size_t n, uint64_t seed);

}  // namespace compcoll::bench
