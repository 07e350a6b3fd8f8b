// Deep Gradient Compression (Lin et al., ICLR 2018) on one rank.
//
// Per step, in one fused pass over g, u and v:
//   local clipping      g *= min(1, (clip / sqrt(N)) / ||g||)   (clip > 0)
//   momentum correction u = m*u + g; v += u        (Nesterov: u = (u+g)*m;
//                       v += u + g); m = 0 means plain accumulation v += g
//   candidate test      |v| >= t, t from a strided sample of |v| (1 %) aimed
//                       a little above k = density * n, so the exact top-k
//                       among the candidates is the tensor's exact top-k
// then the selection is trimmed to exactly k (never by position) or, when the
// sample undershot below 0.8k, rescanned at a lower threshold; and
//   momentum factor masking  u[sent] = 0 at steps whose density is at most
//                       mask_density; v[sent] -= sent value (0 for fp32)
//   warm-up             over the first warmup_steps steps the density falls
//                       from 0.25 to density: geometrically at every step
//                       (smooth), or x1/4 per stage (stages, DGC's schedule);
//                       see warmup_density.
#pragma once

#include "compression/codec.h"
#include "compression/sparse_payload.h"

namespace compcoll {

// How the warm-up's density falls (COMPCOLL_WARMUP_SHAPE).
enum class WarmupShape : uint8_t {
  kStages,  // 0.25, 0.0625, 0.0156, ... held for equal stages (DGC's schedule)
  kSmooth,  // the same fall, geometric at every step (docs/convergence.md)
};
const char* warmup_shape_name(WarmupShape s);

struct SparsifyConfig {
  double density = 0.001;   // fraction of elements sent per step, in (0, 1]
  float momentum = 0.0f;    // momentum correction factor m in [0, 1)
  bool nesterov = false;
  // Momentum factor masking (u restarts at zero where v was sent) applies at
  // steps whose density (warm-up included) is at most this: 1 = always (DGC),
  // 0 = never. Unmasked, u keeps its velocity, so every gradient reaches v
  // with the full 1/(1-m) weight that dense momentum SGD gives it, which
  // helps at high density and hurts (stale momentum) at low density
  // (docs/convergence.md).
  double mask_density = 1.0;
  float clip = 0.0f;        // global L2 clipping threshold; 0 = off
  int world_size = 1;       // N in the local clipping bound clip / sqrt(N)
  int warmup_steps = 0;     // steps over which density ramps down to its target
  WarmupShape warmup_shape = WarmupShape::kStages;
  SparseEncoding encoding;  // how values and indices travel
  // Normalized selection (COMPCOLL_SELECTION, second_moment.h): 0 ranks
  // elements by |v|; beta in (0, 1) ranks them by |v| / sqrt(s), s the
  // moving average (this beta) of the element's squared gradient, which is
  // how far Adam would move it. What is sent is v either way.
  float second_moment_beta = 0.0f;
};

struct DgcConfig : SparsifyConfig {
  double sample_fraction = 0.01;  // share of elements sampled for the threshold
  // Threads for the encode's one full pass (momentum, accumulation,
  // candidates), each over a contiguous range of at least
  // kDgcElemsPerThread elements. The result is the same bits whatever the
  // number: the ranges' candidates are joined in index order and capped as
  // one pass caps them. 1 = the calling thread only.
  int threads = 1;
};

inline constexpr size_t kDgcElemsPerThread = size_t(1) << 18;

// Density of step `step` (0-based) of a warm-up of warmup_steps steps
// towards `density`. Both shapes pass through 0.25^j, j = 1..S (the S powers
// of 1/4 above density), in S equal parts of the warm-up: stages holds 0.25^j
// for part j; smooth falls as 0.25^(1/2 + S * step / warmup_steps), capped
// at 0.25, which crosses 0.25^j at the middle of part j. Never below density.
double warmup_density(double density, int warmup_steps, uint64_t step, WarmupShape shape);

class DgcCodec final : public SparseCodec {
 public:
  explicit DgcCodec(const DgcConfig& config);
  const char* name() const override { return "dgc"; }
  std::unique_ptr<CodecState> make_state(size_t n) const override;
  EncodeInfo encode(const float* grad, size_t n, CodecState& state,
                    Bytes& payload) const override;
  bool fuses_addends() const override;
  EncodeInfo encode_sum(const float* grad, const Addends& addends, size_t n, CodecState& state,
                        Bytes& payload) const override;

 private:
  DgcConfig config_;
};

// Shared by dgc and sdagc after selection: gathers the selected values,
// encodes them, and applies momentum factor masking to the state (when masking).
void emit_sparse(const std::vector<uint32_t>& selected, CodecState& state, uint64_t n,
                 SparseEncoding encoding, bool masking, Bytes& payload);

// State for dgc/sdagc: the residual, and the velocity when momentum is on.
std::unique_ptr<CodecState> make_sparsify_state(const SparsifyConfig& c, size_t n);

// Validates the fields both dgc and sdagc share; throws kInvalidArgument.
void validate_sparsify_config(const SparsifyConfig& c, const char* codec);

}  // namespace compcoll
