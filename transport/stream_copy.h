// stream_copy: a memcpy for whole tensors that writes around the caches.
//
// The host hierarchy moves whole gradients through shared memory
// (transport/shm_group.h): a follower copies its tensor into its slot, and a
// dense result goes back the same way. On the 2-core development machine
// (AMD EPYC, 32 MiB L3, glibc 2.36) glibc's memcpy of 16 MiB took 1.2-1.9 ms
// and this loop of non-temporal stores 0.7-0.9 ms, also with four copies at
// once: the stores do not read every destination line before writing it, and
// a copy far larger than a core's L2 gains nothing by passing through the
// caches. Smaller copies keep memcpy: their destination is likely still
// cached when it is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define COMPCOLL_HAVE_STREAM_STORES 1
#endif

namespace compcoll {

// Copies of at least this many bytes stream (1 MiB: half an L2 of the
// development machine's cores).
inline constexpr size_t kStreamCopyMinBytes = size_t{1} << 20;

inline void stream_copy(void* dst, const void* src, size_t bytes) {
#ifdef COMPCOLL_HAVE_STREAM_STORES
  if (bytes >= kStreamCopyMinBytes) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    // Non-temporal stores need a 16-byte aligned destination.
    const size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    // Streaming stores are weakly ordered: fence them before whatever
    // publishes the copy to another rank (a release store of a counter).
    _mm_sfence();
    return;
  }
#endif
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace compcoll
