// Two-stage 1-bit allreduce with error feedback (1-bit SGD; DeepSpeed's
// compressed allreduce).
//
// Terms: the tensor is cut into R shards of whole scale blocks; rank j owns
// shard j ("server" for it). Every rank is a worker for all shards.
//   1. worker: e = g + worker_error; sign bits + scales of each shard j go
//      to rank j (alltoallv); worker_error = e - D(Q(e)).
//   2. server: rank j decodes the R payloads of its shard in rank order, sums
//      them, adds its server_error, re-quantizes; server_error keeps the
//      re-quantization error.
//   3. allgatherv of the quantized shards; every rank decodes all of them.
// State: v = worker error (n elements), u = server error (own shard), steps.
// Wire per rank: about 2 (R-1)/R of n/8 bytes, 1/32 of a dense ring.
//
// Warm-up (COMPCOLL_WARMUP_STEPS): a tensor's first warmup_steps calls are
// exact dense allreduces, as DeepSpeed's 1-bit Adam runs uncompressed for
// its first steps (freeze_step): sign compression has no density to ramp,
// and early gradients change fastest. last_decision() says which it was.
#pragma once

#include <mutex>
#include <string>

#include "collectives/algorithm.h"
#include "compression/onebit.h"

namespace compcoll {

class OneBitAllreduce final : public Algorithm {
 public:
  explicit OneBitAllreduce(const OneBitConfig& config, int warmup_steps = 0);
  const char* name() const override { return "onebit"; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;
  std::string last_decision() const override { return decision_.get(); }

  struct Shard {
    size_t begin, len;
  };
  // Shard r of an n-element tensor over R ranks (empty shards are legal).
  Shard shard(size_t n, int world_size, int r) const;

 private:
  OneBitConfig config_;
  int warmup_steps_;
  DecisionNote decision_;  // "dense (warm-up ...)" or "compressed"
};

}  // namespace compcoll
