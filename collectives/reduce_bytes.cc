#include "collectives/reduce_bytes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "compcoll/error.h"
#include "compression/half.h"

namespace compcoll {
namespace {

template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return std::min(a, b);
    case ReduceOp::kMax:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return std::max(a, b);
    default: break;
  }
  CC_THROW(kInvalidArgument, "an allreduce of gathered bytes takes SUM, PROD, MIN or MAX, not ",
           reduce_op_name(op));
}

template <typename T>
void reduce_typed(uint8_t* acc, const uint8_t* in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    const T c = combine(a, b, op);
    std::memcpy(acc + i * sizeof(T), &c, sizeof(T));
  }
}

template <typename U>
void reduce_wrapping(uint8_t* acc, const uint8_t* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum || op == ReduceOp::kProd) return reduce_typed<U>(acc, in, n, op);
  using S = std::make_signed_t<U>;
  reduce_typed<S>(acc, in, n, op);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(uint8_t* acc, const uint8_t* in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, acc + 2 * i, 2);
    std::memcpy(&b, in + 2 * i, 2);
    const uint16_t c = FromFloat(combine(ToFloat(a), ToFloat(b), op));
    std::memcpy(acc + 2 * i, &c, 2);
  }
}

}  // namespace

void reduce_into(uint8_t* acc, const uint8_t* in, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return reduce_typed<float>(acc, in, n, op);
    case DType::kFloat64: return reduce_typed<double>(acc, in, n, op);
    case DType::kFloat16: return reduce_half<half_to_float, float_to_half>(acc, in, n, op);
    case DType::kBFloat16: return reduce_half<bf16_to_float, float_to_bf16>(acc, in, n, op);
    case DType::kInt32:
      if (op == ReduceOp::kSum || op == ReduceOp::kProd) return reduce_typed<uint32_t>(acc, in, n, op);
      return reduce_typed<int32_t>(acc, in, n, op);
    case DType::kInt64: return reduce_wrapping<uint64_t>(acc, in, n, op);
    case DType::kUInt8: return reduce_typed<uint8_t>(acc, in, n, op);
    case DType::kInt8: return reduce_wrapping<uint8_t>(acc, in, n, op);
  }
  CC_THROW(kInvalidArgument, "an allreduce of gathered bytes got an unknown dtype");
}

}  // namespace compcoll
