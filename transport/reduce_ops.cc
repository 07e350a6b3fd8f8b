#include "transport/reduce_ops.h"

#include <gloo/math.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "compcoll/error.h"
#include "compression/half.h"

namespace compcoll {

namespace {

// Scalar semantics per op. Floating MIN/MAX propagate NaN.
template <typename T>
T op_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
  }
  return b < a ? b : a;
}

template <typename T>
T op_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
  }
  return a < b ? b : a;
}

template <typename T>
T op_sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T op_prod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // uint8 * uint8 promotes to int and can overflow it for int16-sized
    // types; widen to uint64 first so the product wraps, never UB.
    return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  } else {
    return a * b;
  }
}

struct Min { template <typename T> static T apply(T a, T b) { return op_min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return op_max(a, b); } };
struct Sum { template <typename T> static T apply(T a, T b) { return op_sum(a, b); } };
struct Prod { template <typename T> static T apply(T a, T b) { return op_prod(a, b); } };

// out may alias a or b; each element is read before it is written.
template <typename T, typename Op>
void reduce_plain(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

// 16-bit floats: widen, reduce in float, round back.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Op>
void reduce_narrow(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = FromFloat(Op::apply(ToFloat(x[i]), ToFloat(y[i])));
  }
}

template <typename Op>
ReduceFn for_op(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      if constexpr (std::is_same_v<Op, Sum>) {
        return &gloo::sum<float>;  // Gloo's own kernel: bit-exact with Gloo
      } else {
        return &reduce_plain<float, Op>;
      }
    case DType::kFloat16:
      return &reduce_narrow<half_to_float, float_to_half, Op>;
    case DType::kBFloat16:
      return &reduce_narrow<bf16_to_float, float_to_bf16, Op>;
    case DType::kFloat64: return &reduce_plain<double, Op>;
    case DType::kInt32: return &reduce_plain<int32_t, Op>;
    case DType::kInt64: return &reduce_plain<int64_t, Op>;
    case DType::kUInt8: return &reduce_plain<uint8_t, Op>;
    case DType::kInt8: return &reduce_plain<int8_t, Op>;
  }
  CC_THROW(kInvalidArgument, "allreduce: unknown dtype value ",
           static_cast<int>(dtype),
           " (allowed: float32, float16, bfloat16, float64, int32, int64, "
           "uint8, int8)");
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return for_op<Sum>(dtype);
    case ReduceOp::kMin: return for_op<Min>(dtype);
    case ReduceOp::kMax: return for_op<Max>(dtype);
    case ReduceOp::kProd: return for_op<Prod>(dtype);
    case ReduceOp::kAvg:
      CC_THROW(kInvalidArgument,
               "allreduce: ReduceOp avg is not a transport op; the collectives "
               "layer sums and then divides (allowed here: sum, min, max, prod)");
  }
  CC_THROW(kInvalidArgument, "allreduce: unknown ReduceOp value ",
           static_cast<int>(op), " (allowed: sum, min, max, prod)");
}

}  // namespace compcoll
