#include "compression/sparse_payload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "compression/fp8.h"
#include "compression/golomb.h"
#include "compression/half.h"
#include "compression/varint.h"

namespace compcoll {
namespace {

constexpr size_t kFp8ScaleBytes = 2;   // int16 scale exponent before fp8 codes
constexpr size_t kRiceParamBytes = 1;  // Golomb-Rice parameter before the bits

size_t value_section_bytes(ValueType vt, uint64_t k) {
  return k * value_type_size(vt) + (vt == ValueType::kFp8 ? kFp8ScaleBytes : 0);
}

// The Rice parameter the encoder uses for k positions among n.
int rice_parameter_for(uint64_t k, uint64_t n) {
  return k == 0 || n == 0 ? 0 : golomb_rice_parameter(double(k) / double(n));
}

// Bytes of a Rice index section for k positions among n with parameter b:
// every code is a stop bit and b low bits plus its quotient in unary, and
// the quotients sum to at most n >> b.
size_t rice_section_bytes(uint64_t k, uint64_t n, int b) {
  return kRiceParamBytes + (k * (uint64_t(b) + 1) + (n >> b) + 7) / 8;
}

// Writes values[i] in the payload's type and sets values[i] to what a
// receiver decodes, so that the caller keeps the difference.
uint8_t* store_values(uint8_t* p, ValueType vt, std::span<float> values) {
  switch (vt) {
    case ValueType::kFp32:
      for (float& v : values) store_le<float>(p, v), p += 4;
      return p;
    case ValueType::kFp16:
      for (float& v : values) {
        // A finite value beyond fp16's range is clamped rather than sent as
        // Inf; the excess stays in the sender's residual.
        constexpr float kHalfMax = 65504.0f;
        if (std::isfinite(v)) v = std::clamp(v, -kHalfMax, kHalfMax);
        const uint16_t h = float_to_half(v);
        store_le<uint16_t>(p, h), p += 2;
        v = half_to_float(h);
      }
      return p;
    case ValueType::kBf16:
      for (float& v : values) {
        // As fp16 above: a finite value that rounds beyond bf16's range
        // (|v| > 3.3895e38) is sent as bf16's largest, not as Inf; the
        // excess stays in the sender's residual.
        uint16_t b = float_to_bf16(v);
        constexpr uint16_t kBf16Inf = 0x7f80, kBf16Max = 0x7f7f;
        if (std::isfinite(v) && (b & 0x7fffu) == kBf16Inf) b = uint16_t((b & 0x8000u) | kBf16Max);
        store_le<uint16_t>(p, b), p += 2;
        v = bf16_to_float(b);
      }
      return p;
    case ValueType::kFp8: {
      float max_abs = 0.0f;
      for (const float v : values) {
        if (std::isfinite(v)) max_abs = std::max(max_abs, std::fabs(v));
      }
      const int scale = fp8_scale_for(max_abs);
      store_le<int16_t>(p, static_cast<int16_t>(scale)), p += kFp8ScaleBytes;
      fp8_encode(values, scale, p);
      return p + values.size();
    }
  }
  return p;
}

// A validated view of a sparse payload's sections.
struct SparseLayout {
  uint64_t k;
  ValueType vt;
  IndexType it;
  int fp8_scale = 0;
  const uint8_t* values;  // the k values (after fp8's scale)
  const uint8_t* indices;
  size_t index_bytes;
};

SparseLayout parse_layout(std::span<const uint8_t> payload, uint64_t n) {
  const PayloadHeader h = read_header(payload, PayloadFormat::kSparse, n);
  CC_PAYLOAD_CHECK(h.aux0 <= static_cast<uint8_t>(kLastValueType), "unknown value type ",
                   int(h.aux0));
  CC_PAYLOAD_CHECK(h.aux1 <= static_cast<uint8_t>(kLastIndexType), "unknown index type ",
                   int(h.aux1));
  CC_PAYLOAD_CHECK(h.k <= n, "payload claims ", h.k, " entries for a tensor of ", n);
  SparseLayout l;
  l.k = h.k;
  l.vt = static_cast<ValueType>(h.aux0);
  l.it = static_cast<IndexType>(h.aux1);
  const size_t body = payload.size() - kPayloadHeaderBytes;
  const size_t value_bytes = value_section_bytes(l.vt, h.k);
  CC_PAYLOAD_CHECK(value_bytes <= body, "payload truncated: ", h.k, " ", value_type_name(l.vt),
                   " values need ", value_bytes, " bytes, ", body, " present");
  l.values = payload.data() + kPayloadHeaderBytes;
  l.indices = l.values + value_bytes;
  l.index_bytes = body - value_bytes;
  if (l.vt == ValueType::kFp8) {
    l.fp8_scale = load_le<int16_t>(l.values);
    CC_PAYLOAD_CHECK(l.fp8_scale >= kFp8MinScale && l.fp8_scale <= kFp8MaxScale, "fp8 scale 2^",
                     l.fp8_scale, " outside [2^", kFp8MinScale, ", 2^", kFp8MaxScale, "]");
    l.values += kFp8ScaleBytes;
  }
  if (l.it == IndexType::kU32) {
    CC_PAYLOAD_CHECK(l.index_bytes == h.k * 4, "u32 index section is ", l.index_bytes,
                     " bytes, expected ", h.k * 4);
  }
  if (l.it == IndexType::kRiceGap) {
    CC_PAYLOAD_CHECK(l.index_bytes >= kRiceParamBytes, "rice index section has no parameter byte");
  }
  return l;
}

inline float load_value(const SparseLayout& l, uint64_t i) {
  const uint8_t* v = l.values;
  switch (l.vt) {
    case ValueType::kFp32: return load_le<float>(v + 4 * i);
    case ValueType::kFp16: return half_to_float(load_le<uint16_t>(v + 2 * i));
    case ValueType::kBf16: return bf16_to_float(load_le<uint16_t>(v + 2 * i));
    case ValueType::kFp8: return fp8_to_float(v[i], l.fp8_scale);
  }
  return 0.0f;
}

// Calls fn(i, index) for each entry after checking every index is < n and
// the gap stream is well formed and fully consumed. Validation happens in
// a first pass so that callers can write only after everything checked out.
template <typename Fn>
void for_each_index(const SparseLayout& l, uint64_t n, Fn&& fn) {
  switch (l.it) {
    case IndexType::kU32:
      for (uint64_t i = 0; i < l.k; ++i) fn(i, load_le<uint32_t>(l.indices + 4 * i));
      return;
    case IndexType::kRiceGap: {
      const int b = l.indices[0];
      const std::vector<uint32_t> idx = rice_decode_positions(
          std::span<const uint8_t>(l.indices + kRiceParamBytes, l.index_bytes - kRiceParamBytes),
          l.k, b, n);
      for (uint64_t i = 0; i < l.k; ++i) fn(i, idx[i]);
      return;
    }
    case IndexType::kVarintGap: break;
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
    case ValueType::kFp8: {
      // 256 codes at this payload's scale: one lookup per entry.
      std::array<float, 256> value_of;
      for (int c = 0; c < 256; ++c) value_of[size_t(c)] = fp8_to_float(uint8_t(c), l.fp8_scale);
      return scatter_add(l.k, out, index_at, [v, &value_of](uint64_t i) { return value_of[v[i]]; });
    }
  }
}

// for_each_index with every index checked against n first. The gap codings
// cannot produce one past n (their decoders refuse it); raw u32 can.
template <typename Fn>
void for_each_valid_index(const SparseLayout& l, uint64_t n, Fn&& fn) {
  for_each_index(l, n, [&](uint64_t i, uint32_t idx) {
    CC_PAYLOAD_CHECK(idx < n, "index ", idx, " at entry ", i, " is out of range for a tensor of ",
                     n, " elements");
    fn(i, idx);
  });
}

void validate_indices(const SparseLayout& l, uint64_t n) {
  for_each_valid_index(l, n, [](uint64_t, uint32_t) {});
}

}  // namespace

size_t sparse_payload_max_bytes(size_t k, uint64_t n, SparseEncoding enc) {
  size_t index_bytes = 0;
  switch (enc.indices) {
    case IndexType::kU32: index_bytes = k * 4; break;
    case IndexType::kVarintGap: index_bytes = k * kMaxVarintBytes; break;
    case IndexType::kRiceGap: index_bytes = rice_section_bytes(k, n, rice_parameter_for(k, n)); break;
  }
  return kPayloadHeaderBytes + value_section_bytes(enc.values, k) + index_bytes;
}

void encode_sparse(std::span<const uint32_t> idx, std::span<float> values, uint64_t n,
                   SparseEncoding enc, Bytes& out) {
  CC_CHECK_EQ(idx.size(), values.size(), kInternal, "sparse index/value lists differ in length");
  CC_CHECK(n <= std::numeric_limits<uint32_t>::max(), kInvalidArgument,
           "sparse payloads index with 32 bits; a tensor of ", n, " elements is too large");
  const size_t k = idx.size();
  out.resize(sparse_payload_max_bytes(k, n, enc));
  write_header({PayloadFormat::kSparse, static_cast<uint8_t>(enc.values),
                static_cast<uint8_t>(enc.indices), n, k},
               out.data());
  uint8_t* p = store_values(out.data() + kPayloadHeaderBytes, enc.values, values);
  switch (enc.indices) {
    case IndexType::kU32:
      if (k != 0) std::memcpy(p, idx.data(), k * 4);  // idx.data() may be null when k == 0
      p += k * 4;
      break;
    case IndexType::kVarintGap: {
      uint64_t pos = 0;
      for (size_t i = 0; i < k; ++i) {
        p = write_varint(p, idx[i] - pos);
        pos = uint64_t{idx[i]} + 1;
      }
      break;
    }
    case IndexType::kRiceGap: {
      const int b = rice_parameter_for(k, n);
      *p++ = static_cast<uint8_t>(b);
      out.resize(size_t(p - out.data()));
      rice_encode_positions(idx, b, out);  // appends
      return;
    }
  }
  out.resize(size_t(p - out.data()));
}

void decode_sparse_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n) {
  const SparseLayout l = parse_layout(payload, n);
  if (l.it == IndexType::kU32) {
    validate_indices(l, n);  // before the first write
    const uint8_t* indices = l.indices;
    return scatter_add_values(l, out,
                              [indices](uint64_t i) { return load_le<uint32_t>(indices + 4 * i); });
  }
  // Gaps are decoded (and so validated) into a scratch list first. Decoding
  // them in the scatter loop itself would put a data-dependent branch (the
  // code's length) between the cache misses, and each mispredict would
  // discard the misses in flight.
  thread_local std::vector<uint32_t> decoded;
  decoded.resize(l.k);
  for_each_index(l, n, [&](uint64_t i, uint32_t idx) { decoded[i] = idx; });
  const uint32_t* idx = decoded.data();
  scatter_add_values(l, out, [idx](uint64_t i) { return idx[i]; });
}

SparseEntries decode_sparse(std::span<const uint8_t> payload, uint64_t n) {
  const SparseLayout l = parse_layout(payload, n);
  SparseEntries e;
  e.idx.resize(l.k);
  e.values.resize(l.k);
  for_each_valid_index(l, n, [&](uint64_t i, uint32_t idx) {
    e.idx[i] = idx;
    e.values[i] = load_value(l, i);
  });
  return e;
}

}  // namespace compcoll
