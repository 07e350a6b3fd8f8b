#include "compression/decode.h"

#include "compression/payload.h"
#include "compression/sbc.h"
#include "compression/sparse_payload.h"

namespace compcoll {

void decode_accumulate(std::span<const uint8_t> payload, float* out, uint64_t n) {
  switch (peek_format(payload)) {
    case PayloadFormat::kSparse: return decode_sparse_accumulate(payload, out, n);
    case PayloadFormat::kSbc: return decode_sbc_accumulate(payload, out, n);
    default:
      CC_THROW(kMalformedPayload, "payload format ", int(payload[3]),
               " cannot be accumulated as a sparse contribution");
  }
}

}  // namespace compcoll
