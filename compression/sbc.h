// Sparse Binary Compression (Sattler et al., 2018) on one rank.
//
// Per step: accumulate v += g (with a momentum correction: v += u, u = m*u +
// g, as dgc); find the top k = density * n positive entries
// and the top k negative entries (a strided sample sets each side's
// threshold, one fused pass accumulates and collects both sides' candidates,
// each side is trimmed to its exact top-k); keep the side whose mean
// magnitude is larger; send only its positions, Golomb-Rice coded (b* from
// the realised density, see golomb.h), and its mean. The receiver adds the
// mean at every position; the sender subtracts it there from v, so the
// binarisation error and the other side stay in the residual.
//
// Payload: header (aux0 = b, aux1 = 1 for the negative side, k entries),
// the signed mean as fp32, the non-finite list (non_finite.h: NaN and Inf
// are sent exactly, never binarised), then the Rice bit stream.
//
// Warm-up (exact_warmup): over the first warmup_steps steps the codec is
// dgc at the same densities, on the same residual and velocity: the top-k
// by magnitude with their exact values, in dgc's payload (decode.h reads
// either). Binarising a warm-up stage's 25 % ... 1.6 % of a tensor to one
// mean loses most of what it sends at once and left sbc 11-35 % behind
// dense at 200 steps (docs/convergence.md); exact values while the model
// moves fastest, then positions and a mean once it has settled.
#pragma once

#include <memory>

#include "compression/codec.h"
#include "compression/dgc.h"
#include "compression/non_finite.h"

namespace compcoll {

struct SbcConfig {
  double density = 0.001;
  double sample_fraction = 0.01;
  int warmup_steps = 0;  // density ramps down to its target as dgc's does (dgc.h)
  // DGC's momentum correction, as dgc applies it (dgc.h): u = m*u + g and
  // v += u (Nesterov: v += g + m*u); where positions are sent, u restarts
  // at zero at steps whose density is at most mask_density. 0 = off.
  float momentum = 0.0f;
  bool nesterov = false;
  double mask_density = 1.0;
  // Over the warm-up, send dgc's exact values instead of a binarised side
  // (COMPCOLL_SBC_WARMUP=exact); false = binarise from the first step.
  bool exact_warmup = false;
};

// The dgc configuration sbc's exact warm-up runs (no clipping, fp32 values,
// u32 indices; sbc's density, schedule, momentum and masking gate).
DgcConfig sbc_warmup_config(const SbcConfig& config);

// dgc keeps m times Nesterov's velocity in u (dgc.h), sbc the velocity:
// converts a state dgc warmed up to sbc's form (no-op without Nesterov).
void sbc_adopt_dgc_velocity(const SbcConfig& config, float* u, size_t n);

class SbcCodec final : public SparseCodec {
 public:
  explicit SbcCodec(const SbcConfig& config);
  const char* name() const override { return "sbc"; }
  std::unique_ptr<CodecState> make_state(size_t n) const override;
  EncodeInfo encode(const float* grad, size_t n, CodecState& state,
                    Bytes& payload) const override;

 private:
  SbcConfig config_;
  std::unique_ptr<DgcCodec> warmup_;  // exact_warmup: the codec of the warm-up steps
};

// out[p] += mean for every position p of an sbc payload; validated first.
void decode_sbc_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n);

// Positions and signed mean of an sbc payload (tests, tools).
struct SbcEntries {
  std::vector<uint32_t> idx;
  float mean = 0.0f;
  std::vector<NonFinite> non_finite;
};
SbcEntries decode_sbc(std::span<const uint8_t> payload, uint64_t n);

}  // namespace compcoll
