// Element types and reduction ops shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace compcoll {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,  // SUM followed by division by the world size
  kMin = 2,
  kMax = 3,
  kProd = 4,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* reduce_op_name(ReduceOp op);
bool is_floating(DType dtype);

using Bytes = std::vector<uint8_t>;

}  // namespace compcoll
