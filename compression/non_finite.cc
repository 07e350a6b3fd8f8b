#include "compression/non_finite.h"

#include <cmath>

#include "compression/payload.h"

namespace compcoll {

size_t non_finite_bytes(size_t count) { return 4 + 8 * count; }

void append_non_finite(Bytes& out, const std::vector<NonFinite>& list) {
  const size_t at = out.size();
  out.resize(at + non_finite_bytes(list.size()));
  uint8_t* p = out.data() + at;
  store_le<uint32_t>(p, static_cast<uint32_t>(list.size()));
  p += 4;
  for (const NonFinite& e : list) {
    store_le<uint32_t>(p, e.idx);
    store_le<float>(p + 4, e.value);
    p += 8;
  }
}

size_t parse_non_finite(std::span<const uint8_t> payload, size_t offset, uint64_t n,
                        std::vector<NonFinite>& out) {
  out.clear();
  CC_PAYLOAD_CHECK(payload.size() >= offset + 4, "payload truncated before its non-finite list");
  const uint32_t count = load_le<uint32_t>(payload.data() + offset);
  offset += 4;
  CC_PAYLOAD_CHECK(count <= n && (payload.size() - offset) / 8 >= count, "non-finite list of ",
                   count, " entries does not fit in the payload");
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i, offset += 8) {
    const NonFinite e{load_le<uint32_t>(payload.data() + offset),
                      load_le<float>(payload.data() + offset + 4)};
    CC_PAYLOAD_CHECK(e.idx < n, "non-finite entry ", i, " at index ", e.idx, " is out of range for ", n,
                     " elements");
    CC_PAYLOAD_CHECK(i == 0 || e.idx > out.back().idx, "non-finite indices are not increasing at entry ", i);
    CC_PAYLOAD_CHECK(!std::isfinite(e.value), "non-finite entry ", i, " holds a finite value");
    out.push_back(e);
  }
  return offset;
}

}  // namespace compcoll
