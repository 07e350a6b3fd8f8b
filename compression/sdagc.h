// Standard-deviation adaptive gradient compression (SDAGC) on one rank.
//
// Per step:
//   pass 1  momentum compensation and accumulation into v (as dgc), with
//           local clipping, and the mean and standard deviation sigma of v
//           computed in the same pass;
//   pass 2  candidates |v| >= lambda * sigma.
// lambda starts at the two-sided Gaussian quantile for the density (3.29 at
// 0.001) and after each step is set to what would have selected exactly k
// elements this step, so it tracks the tensor's real tail (heavy-tailed
// layers need a much larger lambda than Gaussian ones). Counts outside
// [0.8k, 1.3k] are corrected within the step: too many are trimmed to the
// exact top-k, too few rescanned at a lower threshold. Sent values and
// masking as dgc. Cheaper than sampling: one pass finds sigma, one selects.
#pragma once

#include "compression/dgc.h"

namespace compcoll {

using SdagcConfig = SparsifyConfig;

// lambda such that P(|Z| >= lambda) = density for a standard normal Z.
double gaussian_two_sided_quantile(double density);

// lambda is one step old. Aiming it a little below the k-th largest |v|
// (about 1.5k Gaussian candidates) means a count that drifts is trimmed from
// the candidates in hand rather than costing a rescan of the whole tensor.
// Shared with the GPU codec (compression/cuda/sdagc_gpu.cc), whose bits match.
constexpr double kSdagcLambdaHeadroom = 0.93;

// The sums sdagc's sigma is taken from, in double.
struct SdagcMoments {
  double sum = 0.0;
  double sum_sq = 0.0;
};

// The standard deviation of n values from their sums. Not finite when a NaN
// or Inf (or a float lane sum that overflowed) reached the sums: the caller
// then takes the moments of the finite values alone. (Clamping the variance
// with std::max(0.0, NaN) would give 0, a finite sigma that sets the
// threshold to its floor and makes every nonzero element a candidate.)
double sdagc_sigma(const SdagcMoments& mo, size_t n);

class SdagcCodec final : public SparseCodec {
 public:
  explicit SdagcCodec(const SdagcConfig& config);
  const char* name() const override { return "sdagc"; }
  std::unique_ptr<CodecState> make_state(size_t n) const override;
  EncodeInfo encode(const float* grad, size_t n, CodecState& state,
                    Bytes& payload) const override;

 private:
  SdagcConfig config_;
};

}  // namespace compcoll
