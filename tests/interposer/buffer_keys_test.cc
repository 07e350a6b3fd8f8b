// BufferKeys: the interposer's error-feedback keys are the buffers' order of
// first use, so a restarted program finds its checkpointed states again.
#include "plugin/nccl_interposer/buffer_keys.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace compcoll::interposer {
namespace {

const void* at(uintptr_t a) { return reinterpret_cast<const void*>(a); }
std::string k(int ordinal, DType dtype) {
  return "nccl:b" + std::to_string(ordinal) + "/" + dtype_name(dtype);
}

TEST(BufferKeys, KeysFollowTheOrderOfFirstUseNotTheAddresses) {
  // Two runs of one program: the same buffers in the same order, elsewhere.
  for (const uintptr_t base : {uintptr_t{0x7f0000000000}, uintptr_t{0x555500001000}}) {
    BufferKeys keys;
    EXPECT_EQ(keys.key(at(base + 0x100), 4000, DType::kFloat32), k(0, DType::kFloat32));
    EXPECT_EQ(keys.key(at(base), 4000, DType::kFloat32), k(1, DType::kFloat32));
    EXPECT_EQ(keys.key(at(base + 0x100), 4000, DType::kFloat32), k(0, DType::kFloat32));
    // The same address with another count or dtype is another buffer, as
    // address keys had it.
    EXPECT_EQ(keys.key(at(base), 2000, DType::kFloat32), k(2, DType::kFloat32));
    EXPECT_EQ(keys.key(at(base), 4000, DType::kFloat16), k(3, DType::kFloat16));
    EXPECT_EQ(keys.key(at(base), 4000, DType::kFloat32), k(1, DType::kFloat32));
    EXPECT_EQ(keys.size(), 4u);
  }
}

TEST(BufferKeys, ForgetsTheLeastRecentlyUsedBeyondTheBoundAndNeverReusesAnOrdinal) {
  BufferKeys keys;
  const size_t n = BufferKeys::kMaxBuffers;
  std::set<std::string> seen;
  for (size_t i = 0; i < n; ++i) {
    seen.insert(keys.key(at(0x1000 + 16 * i), 100, DType::kFloat32));
    // Buffer 0 stays in use all along.
    EXPECT_EQ(keys.key(at(0x1000), 100, DType::kFloat32), k(0, DType::kFloat32));
  }
  EXPECT_EQ(keys.size(), n);
  // One more: the least recently used (buffer 1) is forgotten, buffer 0 is not.
  seen.insert(keys.key(at(0x900000), 100, DType::kFloat32));
  EXPECT_EQ(keys.size(), n);
  EXPECT_EQ(keys.key(at(0x1000), 100, DType::kFloat32), k(0, DType::kFloat32));
  const std::string again = keys.key(at(0x1000 + 16), 100, DType::kFloat32);
  EXPECT_EQ(seen.count(again), 0u) << again << " was handed out before";
  EXPECT_EQ(keys.size(), n);
}

}  // namespace
}  // namespace compcoll::interposer
