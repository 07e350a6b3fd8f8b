#include "compression/payload.h"

namespace compcoll {

const char* payload_format_name(PayloadFormat f) {
  switch (f) {
    case PayloadFormat::kSparse: return "sparse";
    case PayloadFormat::kSbc: return "sbc";
    case PayloadFormat::kOneBit: return "onebit";
  }
  return "unknown";
}

const char* value_type_name(ValueType v) {
  switch (v) {
    case ValueType::kFp32: return "fp32";
    case ValueType::kFp16: return "fp16";
    case ValueType::kBf16: return "bf16";
    case ValueType::kFp8: return "fp8";
  }
  return "unknown";
}

const char* index_type_name(IndexType i) {
  switch (i) {
    case IndexType::kU32: return "u32";
    case IndexType::kVarintGap: return "varint";
    case IndexType::kRiceGap: return "rice";
  }
  return "unknown";
}

std::optional<ValueType> value_type_from_name(std::string_view name) {
  for (int t = 0; t <= static_cast<int>(kLastValueType); ++t) {
    const auto v = static_cast<ValueType>(t);
    if (name == value_type_name(v)) return v;
  }
  return std::nullopt;
}

std::optional<IndexType> index_type_from_name(std::string_view name) {
  for (int t = 0; t <= static_cast<int>(kLastIndexType); ++t) {
    const auto i = static_cast<IndexType>(t);
    if (name == index_type_name(i)) return i;
  }
  return std::nullopt;
}

size_t value_type_size(ValueType v) {
  switch (v) {
    case ValueType::kFp32: return 4;
    case ValueType::kFp16:
    case ValueType::kBf16: return 2;
    case ValueType::kFp8: return 1;
  }
  return 4;
}

void write_header(const PayloadHeader& h, uint8_t* out) {
  CC_CHECK(h.n <= kMaxPayloadElements, kInvalidArgument, payload_format_name(h.format),
           " payloads describe at most ", kMaxPayloadElements, " elements; a tensor of ", h.n,
           " elements is too large");
  CC_CHECK(h.k <= kMaxPayloadElements, kInvalidArgument, payload_format_name(h.format),
           " payloads carry at most ", kMaxPayloadElements, " entries, not ", h.k);
  store_le<uint16_t>(out + 0, kPayloadMagic);
  out[2] = kPayloadVersion;
  out[3] = static_cast<uint8_t>(h.format);
  out[4] = h.aux0;
  out[5] = h.aux1;
  store_le<uint16_t>(out + 6, 0);
  store_le<uint32_t>(out + 8, static_cast<uint32_t>(h.n));
  store_le<uint32_t>(out + 12, static_cast<uint32_t>(h.k));
}

PayloadFormat peek_format(std::span<const uint8_t> payload) {
  CC_PAYLOAD_CHECK(payload.size() >= kPayloadHeaderBytes, "payload of ", payload.size(),
                   " bytes is shorter than the ", kPayloadHeaderBytes, "-byte header");
  const uint16_t magic = load_le<uint16_t>(payload.data());
  CC_PAYLOAD_CHECK(magic == kPayloadMagic, "bad payload magic 0x", std::hex, magic,
                   " (expected 0x", kPayloadMagic, ")");
  CC_PAYLOAD_CHECK(payload[2] == kPayloadVersion, "unsupported payload version ",
                   int(payload[2]), " (this build reads version ", int(kPayloadVersion), ")");
  return static_cast<PayloadFormat>(payload[3]);
}

PayloadHeader read_header(std::span<const uint8_t> payload, PayloadFormat expected_format,
                          uint64_t expected_n) {
  const PayloadFormat format = peek_format(payload);
  CC_PAYLOAD_CHECK(format == expected_format, "payload format ", int(format), " where ",
                   payload_format_name(expected_format), " (", int(expected_format),
                   ") was expected");
  CC_PAYLOAD_CHECK(load_le<uint16_t>(payload.data() + 6) == 0,
                   "reserved header bytes are not zero");
  PayloadHeader h;
  h.format = format;
  h.aux0 = payload[4];
  h.aux1 = payload[5];
  h.n = load_le<uint32_t>(payload.data() + 8);
  h.k = load_le<uint32_t>(payload.data() + 12);
  CC_PAYLOAD_CHECK(h.n == expected_n, "payload describes ", h.n, " elements but the tensor has ",
                   expected_n);
  return h;
}

}  // namespace compcoll
