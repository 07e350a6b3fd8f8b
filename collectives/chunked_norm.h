// Chunked-norm allreduce (csc).
//
//   1. accumulate the gradient into the residual and compute per-chunk L1
//      norms (one fused pass, compression/csc.h);
//   2. allreduce the norm vector (exact): every rank now holds the same norms
//      and so picks the same top chunks;
//   3. pack the selected chunks of the residual and allreduce them densely;
//      they leave the residual, the rest stays.
// No indices travel, and the volume per rank is independent of R.
#pragma once

#include "collectives/algorithm.h"
#include "compression/csc.h"

namespace compcoll {

class ChunkedNormAllreduce final : public Algorithm {
 public:
  explicit ChunkedNormAllreduce(const CscConfig& config);
  const char* name() const override { return "csc"; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;

 private:
  CscConfig config_;
};

}  // namespace compcoll
