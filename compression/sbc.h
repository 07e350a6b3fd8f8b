// Sparse Binary Compression (Sattler et al., 2018) on one rank.
//
// Per step: accumulate v += g (with a momentum correction: v += u, u = m*u +
// g, as dgc); find the top positive and the top negative entries (a strided
// sample sets each side's threshold, one fused pass accumulates and collects
// both sides' candidates, each side is trimmed to its exact top count), and
// send their positions, Golomb-Rice coded (b* from the realised density, see
// golomb.h), with one mean per side sent. The receiver adds the mean at every
// position; the sender subtracts it there from v, so the binarisation error
// and whatever was not sent stay in the residual.
//
// Sides (both_sides, COMPCOLL_SBC_SIDES):
//   - both (the default): the top ceil(k/2) positive and the top ceil(k/2)
//     negative entries, k = density * n, each side binarised to its own
//     mean, a sign bit per position. Entries of the wrong sign (a side with
//     fewer than ceil(k/2) entries of its sign) are not sent.
//   - one (the paper): the top k of each sign, and only the side whose mean
//     magnitude is larger is sent.
//   One side's k entries reach deeper into the distribution than two halves
//   do, and the other sign waits a step, so a step removes less of the
//   residual: on the convergence suite's cnn task (nine seeds) sbc was
//   17.6 % behind dense at 1000 steps with one side and 3.0 % with both, for
//   one more bit per position (docs/convergence.md).
//
// Payload: header (aux0 = b; aux1 = 0 positive side, 1 negative side, 2 both
// sides; k positions), the mean as fp32 (one side: its signed mean; both:
// the positive side's, then the negative side's, 0 for a side without
// positions), the non-finite list (non_finite.h: NaN and Inf are sent
// exactly, never binarised), with both sides ceil(k/8) bytes of one bit per
// position, LSB-first, set where the position takes the negative side's mean
// (padding bits zero), then the Rice bit stream of all k positions.
//
// Warm-up (exact_warmup): over the first warmup_steps steps the codec is
// dgc, on the same residual and velocity: the top-k by magnitude with their
// values, in dgc's payload (decode.h reads either), in warmup_encoding's
// entries and at warmup_density's schedule. The registry passes dgc's (fp8
// values and Rice-coded gaps, and dgc's density under COMPCOLL_DENSITY=auto),
// so sbc warms up exactly as dgc does: a 1000-step job sends 3-4x fewer
// bytes than with fp32 values and u32 indices at sbc's own density, at the
// same accuracy (docs/convergence.md). Binarising a warm-up stage's 25 % ...
// 1.6 % of a tensor to one mean loses most of what it sends at once and
// left sbc 11-35 % behind dense at 200 steps (docs/convergence.md); exact
// values while the model moves fastest, then positions and means once it
// has settled.
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
  bool runs_exact_warmup() const { return exact_warmup && warmup_steps > 0; }
  // Send both signs, each with its mean (COMPCOLL_SBC_SIDES=both); false =
  // only the side with the larger mean magnitude, as the paper.
  bool both_sides = false;
  // Normalized selection (second_moment.h) for the exact warm-up only: the
  // binarised steady state ranks by value, since one mean per side must fit
  // the entries it stands for, and ranking by normalized value mixes scales.
  float second_moment_beta = 0.0f;
  WarmupShape warmup_shape = WarmupShape::kStages;  // how the warm-up's density falls (dgc.h)
  // The exact warm-up's entries and the density it ramps down to: dgc's
  // (COMPCOLL_VALUE_DTYPE, COMPCOLL_INDEX_CODING; dgc's density under
  // COMPCOLL_DENSITY=auto), so that sbc warms up exactly as dgc does and
  // binarises at its own density from the first step after it. 0 = density.
  SparseEncoding warmup_encoding{};
  double warmup_density = 0.0;
};

// The dgc configuration sbc's exact warm-up runs (no clipping; its warm-up
// encoding and density; sbc's schedule, momentum and masking gate).
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

// The payload's side flag (header aux1).
enum SbcSides : uint8_t { kSbcPositiveSide = 0, kSbcNegativeSide = 1, kSbcBothSides = 2 };

// What a binarised step sends: sorted positions and the mean each takes.
struct SbcEntries {
  uint8_t sides = kSbcPositiveSide;
  std::vector<uint32_t> idx;
  std::vector<uint8_t> side;  // per position, which of means it takes (all 0 with one side)
  float means[2] = {0.0f, 0.0f};  // one side: [0] its signed mean; both: positive, negative
  std::vector<NonFinite> non_finite;
  float value(size_t j) const { return means[side[j]]; }
};

// One side's selection: sorted positions and the residual's values there.
struct SbcSelection {
  std::vector<uint32_t> idx;
  std::vector<float> val;
};

// How many entries each side selects when k are wanted: ceil(k/2) with both
// sides, k with one (the GPU codec shares it).
size_t sbc_side_count(size_t wanted, bool both_sides);

// Binarises one step's two selections (the CPU and the GPU codec share it,
// so they send the same bits): both_sides keeps each side's entries of its
// own sign, each with its mean; otherwise the side with the larger mean
// magnitude (ties: positive) is sent whole. Means are summed in double in
// index order. non_finite is not filled.
SbcEntries binarise_sides(const SbcSelection& pos, const SbcSelection& neg, bool both_sides);

// Writes e (and its non-finite list) as an sbc payload for a tensor of n
// elements with Rice parameter b; out is overwritten.
void write_sbc_payload(const SbcEntries& e, int b, uint64_t n, Bytes& out);

// out[p] += its mean for every position of an sbc payload; validated first.
void decode_sbc_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n);

// Positions and means of an sbc payload (tests, tools, the GPU decoder).
SbcEntries decode_sbc(std::span<const uint8_t> payload, uint64_t n);

}  // namespace compcoll
