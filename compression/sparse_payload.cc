#include "compression/sparse_payload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "compression/half.h"
#include "compression/varint.h"

namespace compcoll {
namespace {

void store_value(uint8_t* p, ValueType vt, float& v) {
  switch (vt) {
    case ValueType::kFp32:
      store_le<float>(p, v);
      return;
    case ValueType::kFp16: {
      // A finite value beyond fp16's range is clamped rather than sent as
      // Inf; the excess stays in the sender's residual.
      constexpr float kHalfMax = 65504.0f;
      if (std::isfinite(v)) v = std::clamp(v, -kHalfMax, kHalfMax);
      const uint16_t h = float_to_half(v);
      store_le<uint16_t>(p, h);
      v = half_to_float(h);
      return;
    }
    case ValueType::kBf16: {
      const uint16_t b = float_to_bf16(v);
      store_le<uint16_t>(p, b);
      v = bf16_to_float(b);
      return;
    }
  }
}

inline float load_value(const uint8_t* p, ValueType vt) {
  switch (vt) {
    case ValueType::kFp32: return load_le<float>(p);
    case ValueType::kFp16: return half_to_float(load_le<uint16_t>(p));
    case ValueType::kBf16: return bf16_to_float(load_le<uint16_t>(p));
  }
  return 0.0f;
}

// A validated view of a sparse payload's sections.
struct SparseLayout {
  uint64_t k;
  ValueType vt;
  IndexType it;
  const uint8_t* values;
  const uint8_t* indices;
  size_t index_bytes;
};

SparseLayout parse_layout(std::span<const uint8_t> payload, uint64_t n) {
  const PayloadHeader h = read_header(payload, PayloadFormat::kSparse, n);
  CC_PAYLOAD_CHECK(h.aux0 <= static_cast<uint8_t>(ValueType::kBf16), "unknown value type ",
                   int(h.aux0));
  CC_PAYLOAD_CHECK(h.aux1 <= static_cast<uint8_t>(IndexType::kVarintGap), "unknown index type ",
                   int(h.aux1));
  CC_PAYLOAD_CHECK(h.k <= n, "payload claims ", h.k, " entries for a tensor of ", n);
  SparseLayout l;
  l.k = h.k;
  l.vt = static_cast<ValueType>(h.aux0);
  l.it = static_cast<IndexType>(h.aux1);
  const size_t body = payload.size() - kPayloadHeaderBytes;
  const size_t value_bytes = h.k * value_type_size(l.vt);
  CC_PAYLOAD_CHECK(value_bytes <= body, "payload truncated: ", h.k, " ", value_type_name(l.vt),
                   " values need ", value_bytes, " bytes, ", body, " present");
  l.values = payload.data() + kPayloadHeaderBytes;
  l.indices = l.values + value_bytes;
  l.index_bytes = body - value_bytes;
  if (l.it == IndexType::kU32) {
    CC_PAYLOAD_CHECK(l.index_bytes == h.k * 4, "u32 index section is ", l.index_bytes,
                     " bytes, expected ", h.k * 4);
  }
  return l;
}

// Calls fn(i, index) for each entry after checking every index is < n and
// the varint stream is well formed and fully consumed. Validation happens in
// a first pass so that callers can write only after everything checked out.
template <typename Fn>
void for_each_index(const SparseLayout& l, uint64_t n, Fn&& fn) {
  if (l.it == IndexType::kU32) {
    for (uint64_t i = 0; i < l.k; ++i) {
      const uint32_t idx = load_le<uint32_t>(l.indices + 4 * i);
      fn(i, idx);
    }
    return;
  }
  VarintReader r(l.indices, l.index_bytes);
  uint64_t pos = 0;  // next index is pos + gap
  for (uint64_t i = 0; i < l.k; ++i) {
    const uint64_t gap = r.next();
    CC_PAYLOAD_CHECK(gap < n - pos, "index gap ", gap, " at entry ", i,
                     " runs past the tensor's ", n, " elements");
    const uint64_t idx = pos + gap;
    fn(i, static_cast<uint32_t>(idx));
    pos = idx + 1;
  }
  CC_PAYLOAD_CHECK(r.done(), "varint index section has ", r.remaining(),
                   " trailing bytes after ", l.k, " entries");
}

// Scatter-adds the k values at idx into out, prefetching a few entries
// ahead: indices are sorted and about 1/density apart, so every entry
// touches its own cache line and page, and overlapping those misses is what
// the decode's speed is.
template <typename IndexAt, typename ValueAt>
void scatter_add(uint64_t k, float* out, IndexAt&& index_at, ValueAt&& value_at) {
  constexpr uint64_t kAhead = 16;
  for (uint64_t i = 0; i < k; ++i) {
    if (i + kAhead < k) __builtin_prefetch(out + index_at(i + kAhead), 1);
    out[index_at(i)] += value_at(i);
  }
}

template <typename IndexAt>
void scatter_add_values(const SparseLayout& l, float* out, IndexAt&& index_at) {
  const uint8_t* v = l.values;
  switch (l.vt) {
    case ValueType::kFp32:
      return scatter_add(l.k, out, index_at, [v](uint64_t i) { return load_le<float>(v + 4 * i); });
    case ValueType::kFp16:
      return scatter_add(l.k, out, index_at,
                         [v](uint64_t i) { return half_to_float(load_le<uint16_t>(v + 2 * i)); });
    case ValueType::kBf16:
      return scatter_add(l.k, out, index_at,
                         [v](uint64_t i) { return bf16_to_float(load_le<uint16_t>(v + 2 * i)); });
  }
}

void validate_indices(const SparseLayout& l, uint64_t n) {
  for_each_index(l, n, [&](uint64_t i, uint32_t idx) {
    CC_PAYLOAD_CHECK(idx < n, "index ", idx, " at entry ", i, " is out of range for a tensor of ",
                     n, " elements");
  });
}

}  // namespace

size_t sparse_payload_max_bytes(size_t k, SparseEncoding enc) {
  const size_t index_bytes = enc.indices == IndexType::kU32 ? 4 : kMaxVarintBytes;
  return kPayloadHeaderBytes + k * (value_type_size(enc.values) + index_bytes);
}

void encode_sparse(std::span<const uint32_t> idx, std::span<float> values, uint64_t n,
                   SparseEncoding enc, Bytes& out) {
  CC_CHECK_EQ(idx.size(), values.size(), kInternal, "sparse index/value lists differ in length");
  CC_CHECK(n <= std::numeric_limits<uint32_t>::max(), kInvalidArgument,
           "sparse payloads index with 32 bits; a tensor of ", n, " elements is too large");
  const size_t k = idx.size();
  out.resize(sparse_payload_max_bytes(k, enc));
  write_header({PayloadFormat::kSparse, static_cast<uint8_t>(enc.values),
                static_cast<uint8_t>(enc.indices), n, k},
               out.data());
  uint8_t* p = out.data() + kPayloadHeaderBytes;
  const size_t vsize = value_type_size(enc.values);
  for (size_t i = 0; i < k; ++i, p += vsize) store_value(p, enc.values, values[i]);
  if (enc.indices == IndexType::kU32) {
    if (k != 0) std::memcpy(p, idx.data(), k * 4);  // idx.data() may be null when k == 0
    p += k * 4;
  } else {
    uint64_t pos = 0;
    for (size_t i = 0; i < k; ++i) {
      p = write_varint(p, idx[i] - pos);
      pos = uint64_t{idx[i]} + 1;
    }
  }
  out.resize(p - out.data());
}

void decode_sparse_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n) {
  const SparseLayout l = parse_layout(payload, n);
  if (l.it == IndexType::kU32) {
    validate_indices(l, n);  // before the first write
    const uint8_t* indices = l.indices;
    return scatter_add_values(l, out,
                              [indices](uint64_t i) { return load_le<uint32_t>(indices + 4 * i); });
  }
  // Varint gaps are decoded (and so validated) into a scratch list first.
  // Decoding them in the scatter loop itself would put a data-dependent
  // branch (the gap's byte count) between the cache misses, and each
  // mispredict would discard the misses in flight.
  thread_local std::vector<uint32_t> decoded;
  decoded.resize(l.k);
  for_each_index(l, n, [&](uint64_t i, uint32_t idx) { decoded[i] = idx; });
  const uint32_t* idx = decoded.data();
  scatter_add_values(l, out, [idx](uint64_t i) { return idx[i]; });
}

SparseEntries decode_sparse(std::span<const uint8_t> payload, uint64_t n) {
  const SparseLayout l = parse_layout(payload, n);
  validate_indices(l, n);
  SparseEntries e;
  e.idx.resize(l.k);
  e.values.resize(l.k);
  const size_t vsize = value_type_size(l.vt);
  for_each_index(l, n, [&](uint64_t i, uint32_t idx) {
    e.idx[i] = idx;
    e.values[i] = load_value(l.values + i * vsize, l.vt);
  });
  return e;
}

}  // namespace compcoll
