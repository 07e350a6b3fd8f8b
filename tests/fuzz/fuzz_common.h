// Shared pieces of the libFuzzer targets (tests/fuzz/*_fuzz.cc).
//
// Decoder targets read their input as
//
//   byte 0      flags: bit 0 = take n from the payload header (else from
//               bytes 1-2), bit 1 = onebit's accumulate mode, bit 2 = also
//               run the target's secondary entry point (decode_sparse,
//               decode_sbc, ...)
//   bytes 1-2   n as little-endian u16, when bit 0 is clear
//   bytes 3..   the payload, exactly as a peer would send it
//
// so that the seeds (real encoder output, see make_corpus.cc) reach the deep
// paths at once while the fuzzer is still free to lie about n.
//
// The invariants every decoder target checks (a failure calls fuzz_fail,
// which aborts, so libFuzzer records the input as a crash):
//   - the only exception is compcoll::Error of kind kMalformedPayload;
//   - on that error the output buffer is bit-for-bit what it was before;
//   - the output buffer is a heap block of exactly n floats, so ASan sees
//     any write out of bounds;
//   - on success the output equals an independent reference computed here
//     from the decoded entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include "compcoll/error.h"
#include "compcoll/types.h"
#include "compression/payload.h"

namespace compcoll::fuzz {

// Largest tensor a decoder target allocates for (floats). Bigger n is cut
// to this; the header then disagrees and the decoder must say so.
// (Small enough that allocating and comparing a few copies per input stays
// cheap next to the decoding itself.)
constexpr uint64_t kMaxN = uint64_t{1} << 16;

[[noreturn]] inline void fuzz_fail(const char* what) {
  std::fprintf(stderr, "FUZZ INVARIANT VIOLATED: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) ::compcoll::fuzz::fuzz_fail(what); \
  } while (0)

struct DecoderInput {
  uint8_t flags = 0;
  uint64_t n = 0;
  std::span<const uint8_t> payload;
  bool accumulate() const { return flags & 2; }
  bool secondary() const { return flags & 4; }
};

inline DecoderInput split_input(const uint8_t* data, size_t size) {
  DecoderInput in;
  if (size < 3) {
    in.payload = {data, size};
    in.n = size;
    return in;
  }
  in.flags = data[0];
  in.payload = {data + 3, size - 3};
  if ((in.flags & 1) && in.payload.size() >= kPayloadHeaderBytes) {
    uint32_t h;  // the header's n (payload.h: 32 bits at offset 8)
    std::memcpy(&h, in.payload.data() + 8, sizeof h);
    in.n = h <= kMaxN ? h : kMaxN;
  } else {
    in.n = uint64_t{data[1]} | (uint64_t{data[2]} << 8);
  }
  return in;
}

// A deterministic, finite, non-trivial initial output (so that "+=" and "="
// are distinguishable and untouched-ness is meaningful).
inline std::vector<float> initial_output(uint64_t n) {
  static const std::vector<float> pattern = [] {
    std::vector<float> p(static_cast<size_t>(kMaxN));
    uint32_t x = 0x9E3779B9u;
    for (auto& v : p) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      v = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / 1024.0f;
    }
    return p;
  }();
  if (n > kMaxN) fuzz_fail("initial_output: n above kMaxN");
  return std::vector<float>(pattern.begin(), pattern.begin() + static_cast<ptrdiff_t>(n));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Same bytes (memcmp is not called with a null pointer, even for size 0).
inline bool same_bytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Bitwise equal, except that any NaN matches any NaN: the compiler may
// commute a + b, and which operand's NaN payload survives is then not ours
// to pin down.
inline bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != a[i] && b[i] != b[i]) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

// Runs f(); returns true when it returned, false when it threw
// compcoll::Error(kMalformedPayload). Anything else is a finding.
template <typename F>
bool decodes(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kMalformedPayload) fuzz_fail("decoder threw an Error that is not kMalformedPayload");
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    fuzz_fail("decoder threw something other than compcoll::Error");
  } catch (...) {
    fuzz_fail("decoder threw a non-standard exception");
  }
}

// A decoder that writes into `out` (n floats): on error `out` must be left
// as it was. Returns whether it decoded.
template <typename F>
bool decode_checked(std::vector<float>& out, F&& f) {
  const std::vector<float> before = out;
  const bool ok = decodes([&] { f(out.data()); });
  if (!ok) FUZZ_CHECK(same_bits(out, before), "a rejected payload modified the output");
  return ok;
}

}  // namespace compcoll::fuzz
