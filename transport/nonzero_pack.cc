#include "transport/nonzero_pack.h"

#include <cstring>

#include "compcoll/error.h"

namespace compcoll {

size_t pack_nonzeros(const float* src, size_t len, uint32_t* out, size_t cap) {
  size_t count = 0;
  size_t i = 0;
  // Blocks of 16 words: the OR of a block is vectorised by the compiler and
  // almost every block of a sparse result is all zero, so the scan runs at
  // the speed of reading memory.
  constexpr size_t kBlock = 16;
  for (; i + kBlock <= len; i += kBlock) {
    uint32_t w[kBlock];
    std::memcpy(w, src + i, sizeof w);
    uint32_t any = 0;
    for (size_t j = 0; j < kBlock; ++j) any |= w[j];
    if (any == 0) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      if (w[j] == 0) continue;
      if (count == cap) return kNotSparse;
      out[2 * count] = static_cast<uint32_t>(i + j);
      out[2 * count + 1] = w[j];
      ++count;
    }
  }
  for (; i < len; ++i) {
    uint32_t w;
    std::memcpy(&w, src + i, sizeof w);
    if (w == 0) continue;
    if (count == cap) return kNotSparse;
    out[2 * count] = static_cast<uint32_t>(i);
    out[2 * count + 1] = w;
    ++count;
  }
  return count;
}

size_t pack_listed(const float* src, size_t off, size_t len, std::span<const uint32_t> listed,
                   uint32_t* out, size_t cap) {
  size_t count = 0;
  for (const uint32_t i : listed) {
    if (i < off || i - off >= len) continue;
    uint32_t w;
    std::memcpy(&w, src + i, sizeof w);
    if (w == 0) continue;  // e.g. two hosts' values that cancelled exactly
    if (count == cap) return kNotSparse;
    out[2 * count] = static_cast<uint32_t>(i - off);
    out[2 * count + 1] = w;
    ++count;
  }
  return count;
}

void unpack_nonzeros(const uint32_t* pairs, size_t count, float* dst, size_t len) {
  std::memset(dst, 0, len * sizeof(float));
  for (size_t e = 0; e < count; ++e) {
    const uint32_t idx = pairs[2 * e];
    CC_CHECK_LT(idx, len, kInternal, "the host's shared result names element ", idx, " of a ",
                len, "-element round (corrupted shared memory)");
    std::memcpy(dst + idx, &pairs[2 * e + 1], sizeof(float));
  }
}

}  // namespace compcoll
