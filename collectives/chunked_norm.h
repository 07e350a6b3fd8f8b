// Chunked-norm allreduce (csc).
//
//   1. accumulate the gradient into the residual and compute per-chunk L1
//      norms (one fused pass, compression/csc.h);
//   2. allreduce the norm vector (exact): every rank now holds the same norms
//      and so picks the same top chunks;
//   3. pack the selected chunks of the residual and allreduce them densely;
//      they leave the residual, the rest stays.
// No indices travel, and the volume per rank is independent of R.
//
// Warm-up (COMPCOLL_WARMUP_STEPS): over a tensor's first warmup_steps calls
// every chunk is selected, so the call is exact (the momentum correction, if
// any, still runs: what goes out is the corrected velocity), and momentum
// factor masking applies only where warmup_masking says (masking every
// chunk at every step would restart the velocity each step). Like onebit's
// dense warm-up: csc's chunks are too coarse for DGC's density ramp on
// small tensors (a 38k-element tensor has 3 chunks of 16384).
#pragma once

#include "collectives/algorithm.h"
#include "compression/csc.h"

namespace compcoll {

class ChunkedNormAllreduce final : public Algorithm {
 public:
  explicit ChunkedNormAllreduce(const CscConfig& config, int warmup_steps = 0,
                                bool warmup_masking = false);
  const char* name() const override { return "csc"; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  // Lists the selected chunks' elements where they are at most 1/8 of the
  // tensor (after the warm-up, which sends every chunk).
  CallInfo allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;
  std::string last_decision() const override { return decision_.get(); }

 private:
  CallInfo run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
               bool list_support) const;
  CscConfig config_;
  int warmup_steps_;
  bool warmup_masking_;
  DecisionNote decision_;  // "dense (warm-up ...)" or "compressed"
};

}  // namespace compcoll
