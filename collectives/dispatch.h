// Routing one allreduce call: the compressed algorithm takes float32, fp16
// and bf16 tensors of at least min_elems and at most kMaxPayloadElements
// (2^32 - 1, what a payload header counts) elements with SUM or AVG
// (fp16/bf16 run through an fp32 copy, so residuals stay fp32); everything
// else takes the exact dense path.
#pragma once

#include <cstddef>

#include "collectives/algorithm.h"

namespace compcoll {

struct Route {
  bool compressed;
  const char* reason;  // why, for logs: "compressed", "dtype int32 is not floating", ...
  bool device_buffers = false;  // the call's buffers are device memory (the device route)
};

Route choose_route(const Algorithm& algo, size_t count, DType dtype, ReduceOp op, size_t min_elems);

// Runs the call on the chosen route. state must be non-null on the
// compressed route (made by algo.make_state(count, comm.size())).
CallInfo run_allreduce(Comm& comm, const Algorithm& algo, const Route& route, void* buf,
                       size_t count, DType dtype, ReduceOp op, CodecState* state);

}  // namespace compcoll
