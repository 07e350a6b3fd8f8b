// A compressed allreduce algorithm: the codec of compression/ plus the
// communication pattern that moves its payloads, written once against the
// Comm seam. Every algorithm obeys DESIGN.md's rules: the same bits on every
// rank, nothing lost (error feedback), non-finite values not hidden, peers'
// payloads validated before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/comm.h"
#include "compression/codec.h"
#include "compression/dgc.h"  // WarmupShape
#include "compression/onebit.h"
#include "compression/payload.h"

namespace compcoll {

// How dgc and sdagc move their payloads (COMPCOLL_SPARSE_PATTERN): allgather
// (every rank receives every payload: (P-1)k entries), scatter (region owners
// reduce and select: O(k) per rank whatever P, sparse_scatter.h), or auto
// (the cheaper by auto.h's cost model for this P, k and the measured link).
enum class SparsePattern : uint8_t { kAllgather = 0, kScatter = 1, kAuto = 2 };
const char* sparse_pattern_name(SparsePattern p);

// What dgc and sdagc (and sbc's exact warm-up) rank the residual by
// (COMPCOLL_SELECTION, compression/second_moment.h): |v| (magnitude),
// |v| / sqrt(moving average of g^2) (normalized: what Adam would move), or
// auto: normalized once Adam's beta1 is moved into compcoll
// (momentum_handover.h), magnitude otherwise.
enum class Selection : uint8_t { kMagnitude = 0, kNormalized = 1, kAuto = 2 };
const char* selection_name(Selection s);
// The moving average's beta for normalized selection: Adam's default beta2.
constexpr float kNormalizedSelectionBeta = 0.999f;

// AlgoParams::density's "auto" (no valid density is 0): see density_for.
inline constexpr double kAutoDensity = 0.0;
// AlgoParams::codec_threads's "auto" (no valid count is 0).
inline constexpr int kAutoCodecThreads = 0;

// The effective configuration of the compressed algorithms: every knob that
// changes the math. Ranks must agree on all of it (see agreement.h).
struct AlgoParams {
  // dgc, sbc, sdagc: fraction of elements sent; kAutoDensity: per algorithm
  // (density_for, registry.h), COMPCOLL_DENSITY's default.
  double density = 0.001;
  float momentum = 0.0f;         // momentum correction (dgc, sdagc, sbc, csc)
  bool nesterov = false;
  // Momentum factor masking at steps of at most this density (dgc, sdagc;
  // csc: its chunk fraction). 1 = always, 0 = never; below 0 = "auto":
  // always with a configured momentum, only after the warm-up with one
  // taken from the optimizer (momentum_handover.h, optimizer_momentum_params).
  double momentum_masking_density = 1.0;
  bool momentum_handover = false;  // hand the optimizer s_t - momentum * s_(t-1)
  // COMPCOLL_MOMENTUM_HANDOVER=auto: where the caller can see the optimizer
  // (the PyTorch backend) and momentum is 0, the hand-over is switched on
  // with the optimizer's SGD momentum once every rank has reported it.
  bool momentum_from_optimizer = false;
  float clip = 0.0f;             // local gradient clipping threshold; 0 = off
  // dgc, sdagc, sbc density ramp; onebit runs dense. COMPCOLL_WARMUP_STEPS's
  // default (700, plugin/config.cc) applies through the configuration; 0 here
  // keeps code that builds AlgoParams itself (tests, benchmarks) on the
  // steady state.
  int warmup_steps = 0;
  // How the ramp falls; COMPCOLL_WARMUP_SHAPE's default (smooth) applies
  // through the configuration.
  WarmupShape warmup_shape = WarmupShape::kStages;
  ValueType values = ValueType::kFp32;  // sparse value encoding
  IndexType indices = IndexType::kU32;  // sparse index encoding
  size_t csc_chunk = 16384;      // csc chunk size (elements)
  double csc_fraction = 0.01;    // csc: fraction of chunks sent
  size_t onebit_block = 2048;    // onebit: elements per scale
  ScaleMode onebit_scale = ScaleMode::kMeanMagnitude;
  float onebit_residual_bound = 0.5f;  // onebit: |residual| <= this x block scale; 0 = unbounded
  double sample_fraction = 0.01; // dgc, sbc: threshold sample
  // dgc: threads for the encode's pass (DgcConfig::threads). The same bits
  // whatever the number, so ranks need not agree: not in canonical().
  // kAutoCodecThreads: COMPCOLL_CODEC_THREADS=auto, which the Communicator
  // resolves at creation (1 unless it stages device tensors); an algorithm
  // built with it unresolved runs one thread.
  int codec_threads = 1;
  // sbc: dgc's exact values over the warm-up, binarised after it (sbc.h).
  // COMPCOLL_SBC_WARMUP's default (exact) applies through the configuration.
  bool sbc_exact_warmup = false;
  // Whether sbc sends dgc's entries at all: its exact warm-up asked for
  // and a warm-up to run it in. Without it sbc reads none of dgc's entry
  // settings (selection, value and index coding).
  bool sbc_runs_exact_warmup() const { return sbc_exact_warmup && warmup_steps > 0; }
  // sbc: both signs, each with its mean (sbc.h). COMPCOLL_SBC_SIDES's
  // default (both) applies through the configuration.
  bool sbc_both_sides = false;
  std::string auto_algo = "dgc";  // auto: the compressed algorithm it weighs against dense
  SparsePattern sparse_pattern = SparsePattern::kAuto;  // dgc, sdagc
  // COMPCOLL_SELECTION; its default (auto) applies through the configuration.
  Selection selection = Selection::kMagnitude;

  // "key=value;..." of every field: hashed for agreement, shown on mismatch.
  std::string canonical() const;
};

// The shape of one call's communication, for auto's cost model: bytes this
// rank sends and the number of latency-bound rounds it waits through.
struct CostShape {
  double wire_bytes = 0.0;
  int rounds = 0;
  bool ring_allreduce = false;  // dense ring: pays the ring's latency instead
};

// What one call did, for stats and the benchmark.
struct CallInfo {
  size_t payload_bytes = 0;  // this rank's compressed contribution
  size_t selected = 0;       // elements this rank contributed
  // Set by allreduce_listing_support() where the algorithm knows it without
  // a pass over the result: every index in [0, n) where the result can be
  // nonzero (by bits), possibly repeated, in no particular order. Unset:
  // not known (an empty list is known: the result is all zero words).
  std::optional<std::vector<uint32_t>> support{};
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  // Error-feedback state for an n-element tensor on a communicator of
  // world_size ranks (onebit's server error depends on the shard size).
  virtual std::unique_ptr<CodecState> make_state(size_t n, int world_size) const = 0;
  // In-place allreduce of n float32: SUM, or AVG when average. Collective:
  // every rank calls it with the same n.
  virtual CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                             CodecState& state) const = 0;

  // allreduce(), and where the algorithm knows cheaply where its result can
  // be nonzero (the sparse patterns' decoded indices, csc's chosen chunks),
  // lists that in the CallInfo's support. The host hierarchy's leaders call this to
  // share a sparse result without scanning the tensor for it. Default: lists
  // nothing (support stays unset).
  virtual CallInfo allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                             CodecState& state) const {
    return allreduce(comm, buf, n, average, state);
  }

  // allreduce_listing_support() of buf + addends: the host hierarchy's leader
  // passes its host's other ranks' parts of the local reduce's last round
  // (Addends, in shared memory) for the algorithm to add in its own first
  // pass over buf. The same bits as adding them into buf first, which is
  // the default.
  virtual CallInfo allreduce_host_sum(Comm& comm, float* buf, const Addends& addends, size_t n,
                                      bool average, CodecState& state) const {
    add_addends(buf, addends);
    return allreduce_listing_support(comm, buf, n, average, state);
  }

  // Communication of an n-element call on world_size ranks.
  virtual CostShape cost_shape(size_t n, int world_size) const = 0;

  // Called once per communicator, collectively, after the ranks agreed on
  // the configuration (auto measures the link here). Default: nothing.
  virtual void attach(Comm& comm) { (void)comm; }
  // Instead of attach(), for an algorithm rebuilt with other parameters in
  // the middle of a communicator's life (Communicator::adopt_optimizer_momentum):
  // takes over what `before` learnt when it was attached, so that the
  // rebuild is not collective. Default: nothing.
  virtual void take_attachment(const Algorithm& before) { (void)before; }
  // The algorithm a wrapper (the momentum hand-over) runs; itself otherwise.
  virtual const Algorithm& unwrapped() const { return *this; }

  // What the last call decided, when the algorithm decides per call (auto;
  // onebit's and csc's warm-up); empty otherwise.
  virtual std::string last_decision() const { return {}; }
};

// An algorithm's last_decision(), set by its calls, which may come from
// several threads.
class DecisionNote {
 public:
  void set(std::string text) const {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
  }
  std::string get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::string text_;
};

// "dense (warm-up step i of n)": a warm-up call's decision, for the
// communicator's log and stats (counted as uncompressed, and as a warm-up
// call: is_warmup_decision).
std::string warmup_decision(uint64_t step, int warmup_steps);
bool is_warmup_decision(const std::string& decision);

// buf[i] *= 1 / world_size (AVG after a SUM).
void scale_in_place(float* buf, size_t n, int world_size);

}  // namespace compcoll
