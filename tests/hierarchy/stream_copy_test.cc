// transport/stream_copy.h: the hierarchy's copy of whole tensors into and
// out of shared memory must be memcpy, byte for byte, for every size (below
// and above the streaming threshold, with head and tail bytes that do not
// fill a 64-byte step) and every alignment of either side.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "transport/stream_copy.h"

namespace compcoll {
namespace {

TEST(StreamCopy, EqualsMemcpyForEverySizeAndAlignment) {
  const size_t big = kStreamCopyMinBytes;
  const std::vector<size_t> sizes = {0, 1, 15, 63, 64, 65, big - 1, big, big + 1, big + 63,
                                     3 * big + 17};
  std::vector<uint8_t> src(3 * big + 17 + 64);
  // Every byte value, in a pattern that differs from one 64-byte step to the next.
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + i / 64);
  for (const size_t bytes : sizes) {
    for (const size_t src_off : {0, 1, 8, 15}) {
      for (const size_t dst_off : {0, 1, 4, 13}) {
        std::vector<uint8_t> dst(bytes + 64, 0xA5);
        stream_copy(dst.data() + dst_off, src.data() + src_off, bytes);
        const auto where = testing::Message() << bytes << " bytes, source offset " << src_off
                                              << ", destination offset " << dst_off;
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xA5) << where << ": byte " << i;
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(dst[dst_off + i], src[src_off + i]) << where << ": byte " << i;
        }
        for (size_t i = dst_off + bytes; i < dst.size(); ++i) {
          ASSERT_EQ(dst[i], 0xA5) << where << ": byte " << i << " past the end was written";
        }
      }
    }
  }
}

}  // namespace
}  // namespace compcoll
