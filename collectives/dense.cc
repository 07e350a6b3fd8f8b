#include "collectives/dense.h"

#include <string>
#include <vector>

#include "compcoll/error.h"
#include "compression/half.h"

namespace compcoll {

void scale_in_place(float* buf, size_t n, int world_size) {
  const float inv = 1.0f / static_cast<float>(world_size);
  for (size_t i = 0; i < n; ++i) buf[i] *= inv;
}

namespace {
constexpr const char* kWarmupDecision = "dense (warm-up step ";
}  // namespace

std::string warmup_decision(uint64_t step, int warmup_steps) {
  return kWarmupDecision + std::to_string(step + 1) + " of " + std::to_string(warmup_steps) + ")";
}

bool is_warmup_decision(const std::string& decision) {
  return decision.rfind(kWarmupDecision, 0) == 0;
}

namespace {

template <typename T>
void divide(T* p, size_t n, int world_size) {
  for (size_t i = 0; i < n; ++i) p[i] /= static_cast<T>(world_size);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divide_half(uint16_t* p, size_t n, int world_size) {
  for (size_t i = 0; i < n; ++i) p[i] = FromFloat(ToFloat(p[i]) / static_cast<float>(world_size));
}

}  // namespace

void dense_allreduce(Comm& comm, void* buf, size_t count, DType dtype, ReduceOp op) {
  if (op != ReduceOp::kAvg) {
    comm.allreduce(buf, count, dtype, op);
    return;
  }
  CC_CHECK(is_floating(dtype), kInvalidArgument, "AVG allreduce of ", dtype_name(dtype),
           " is not supported (integer averages would truncate); use SUM");
  comm.allreduce(buf, count, dtype, ReduceOp::kSum);
  const int R = comm.size();
  switch (dtype) {
    case DType::kFloat32: return divide(static_cast<float*>(buf), count, R);
    case DType::kFloat64: return divide(static_cast<double*>(buf), count, R);
    case DType::kFloat16:
      return divide_half<half_to_float, float_to_half>(static_cast<uint16_t*>(buf), count, R);
    case DType::kBFloat16:
      return divide_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(buf), count, R);
    default: break;
  }
}

CallInfo DenseAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                   CodecState&) const {
  dense_allreduce(comm, buf, n, DType::kFloat32, average ? ReduceOp::kAvg : ReduceOp::kSum);
  return {ring_allreduce_bytes(n * sizeof(float), comm.size()), n};
}

}  // namespace compcoll
