#include "collectives/dispatch.h"

#include <cstring>
#include <string_view>
#include <vector>

#include "collectives/dense.h"
#include "compcoll/error.h"
#include "compression/half.h"
#include "compression/payload.h"

namespace compcoll {

Route choose_route(const Algorithm& algo, size_t count, DType dtype, ReduceOp op, size_t min_elems) {
  if (std::string_view(algo.name()) == "dense") return {false, "algorithm is dense"};
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return {false, "dtype is not float32, float16 or bfloat16"};
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) return {false, "op is not SUM or AVG"};
  if (count < min_elems) return {false, "tensor is smaller than COMPCOLL_MIN_ELEMS"};
  // Refused here, before any error-feedback state is touched: an encoder
  // that found the count too large for its header would throw mid-call,
  // with the residual already updated.
  static_assert(kMaxPayloadElements == 4294967295ull, "the reason below names the limit");
  if (count > kMaxPayloadElements) {
    return {false, "tensor has more than 4294967295 elements, the most a payload describes"};
  }
  return {true, "compressed"};
}

CallInfo run_allreduce(Comm& comm, const Algorithm& algo, const Route& route, void* buf,
                       size_t count, DType dtype, ReduceOp op, CodecState* state) {
  if (!route.compressed) {
    dense_allreduce(comm, buf, count, dtype, op);
    return {ring_allreduce_bytes(count * dtype_size(dtype), comm.size()), count};
  }
  CC_CHECK(state != nullptr, kInternal, "compressed allreduce without error-feedback state");
  const bool average = op == ReduceOp::kAvg;
  if (dtype == DType::kFloat32) {
    return algo.allreduce(comm, static_cast<float*>(buf), count, average, *state);
  }
  // fp16/bf16: compress an fp32 copy; the residual stays fp32.
  auto* h = static_cast<uint16_t*>(buf);
  std::vector<float> f(count);
  const bool bf16 = dtype == DType::kBFloat16;
  for (size_t i = 0; i < count; ++i) f[i] = bf16 ? bf16_to_float(h[i]) : half_to_float(h[i]);
  const CallInfo info = algo.allreduce(comm, f.data(), count, average, *state);
  for (size_t i = 0; i < count; ++i) h[i] = bf16 ? float_to_bf16(f[i]) : float_to_half(f[i]);
  return info;
}

}  // namespace compcoll
