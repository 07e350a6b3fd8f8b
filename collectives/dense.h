// The exact dense allreduce: the `dense` algorithm and the fallback for
// everything the compressed paths do not take (integer dtypes, MIN/MAX/PROD,
// small tensors). AVG is a SUM followed by division by the world size, for
// floating dtypes only.
#pragma once

#include "collectives/algorithm.h"

namespace compcoll {

void dense_allreduce(Comm& comm, void* buf, size_t count, DType dtype, ReduceOp op);

// Bytes a rank sends in a ring allreduce of `bytes` over R ranks: the
// reference every compression ratio is quoted against.
inline size_t ring_allreduce_bytes(size_t bytes, int world_size) {
  return world_size <= 1 ? 0 : 2 * (world_size - 1) * bytes / world_size;
}

class DenseAllreduce final : public Algorithm {
 public:
  const char* name() const override { return "dense"; }
  std::unique_ptr<CodecState> make_state(size_t, int) const override {
    return std::make_unique<CodecState>(0);
  }
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override {
    return {double(ring_allreduce_bytes(n * sizeof(float), world_size)), 0, true};
  }
};


}  // namespace compcoll
