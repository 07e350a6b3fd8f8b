// LEB128 varints for gap-coded indices. Values here fit in 32 bits, so a
// varint is at most 5 bytes; the reader rejects longer or overflowing ones.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compression/payload.h"

namespace compcoll {

constexpr size_t kMaxVarintBytes = 5;

inline uint8_t* write_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

class VarintReader {
 public:
  VarintReader(const uint8_t* p, size_t len) : p_(p), end_(p + len) {}

  uint64_t next() {
    uint64_t v = 0;
    for (size_t i = 0; i < kMaxVarintBytes; ++i) {
      CC_PAYLOAD_CHECK(p_ < end_, "varint index section is truncated");
      const uint8_t b = *p_++;
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if ((b & 0x80) == 0) {
        CC_PAYLOAD_CHECK(v <= 0xffffffffu, "varint value ", v, " exceeds 32 bits");
        return v;
      }
    }
    CC_THROW(kMalformedPayload, "varint longer than ", kMaxVarintBytes, " bytes");
  }

  bool done() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace compcoll
