// Sparse-allgather allreduce (dgc, sbc, sdagc).
//
// Each rank encodes its gradient into a sparse payload (its codec updates the
// residual), allgathers the payloads, and every rank decodes all of them in
// rank order into a zeroed buffer: the same additions in the same order on
// every rank, hence bitwise-identical results. Cost per rank: its payload to
// R-1 peers; the volume grows with R (csc's does not).
#pragma once

#include "collectives/algorithm.h"

namespace compcoll {

class SparseAllgatherAllreduce final : public Algorithm {
 public:
  // bytes_per_entry and density describe the payloads for the cost model.
  SparseAllgatherAllreduce(const char* name, std::unique_ptr<SparseCodec> codec, double density,
                           double bytes_per_entry)
      : name_(name), codec_(std::move(codec)), density_(density), bytes_per_entry_(bytes_per_entry) {}
  const char* name() const override { return name_; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;

 private:
  const char* name_;
  std::unique_ptr<SparseCodec> codec_;
  double density_;
  double bytes_per_entry_;
};

}  // namespace compcoll
