#include "collectives/sparse_allgather.h"

#include <algorithm>

#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/payload.h"

namespace compcoll {

void reject_peer_payload(const char* name, const Comm& comm, int peer, const std::exception& e) {
  CC_THROW(kMalformedPayload, name, " allreduce on rank ", comm.rank(), ": payload from rank ",
           peer, " rejected: ", e.what());
}

CallInfo sparse_allgather(Comm& comm, const char* name, const SparseCodec& codec, float* buf,
                          size_t n, bool average, CodecState& state, bool list_support,
                          const Addends& addends) {
  Bytes payload;
  const EncodeInfo info = encode_with_addends(codec, buf, addends, n, state, payload);
  // buf is encoded: zero it for the decode while the payloads travel.
  const Gathered all = comm.allgatherv_overlapping(payload, max_payload_bytes(n),
                                                   [&] { std::fill(buf, buf + n, 0.0f); });
  CC_CHECK_EQ(all.parts(), comm.size(), kInternal, "allgatherv returned the wrong number of parts");
  CallInfo call{payload.size(), info.sent};
  if (list_support) call.support.emplace();
  for (int r = 0; r < all.parts(); ++r) {
    try {
      decode_accumulate(all.part(r), buf, n);
      // Validated by the decode above; a second pass over k entries, not n.
      if (call.support) append_payload_indices(all.part(r), n, *call.support);
    } catch (const Error& e) {
      reject_peer_payload(name, comm, r, e);
    }
  }
  if (average) scale_in_place(buf, n, comm.size());
  return call;
}

}  // namespace compcoll
