#include "collectives/sparse_allgather.h"

#include <algorithm>

#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/payload.h"

namespace compcoll {

std::unique_ptr<CodecState> SparseAllgatherAllreduce::make_state(size_t n, int) const {
  return codec_->make_state(n);
}

CallInfo SparseAllgatherAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                             CodecState& state) const {
  Bytes payload;
  const EncodeInfo info = codec_->encode(buf, n, state, payload);
  const Gathered all = comm.allgatherv(payload, max_payload_bytes(n));
  CC_CHECK_EQ(all.parts(), comm.size(), kInternal, "allgatherv returned the wrong number of parts");
  std::fill(buf, buf + n, 0.0f);
  for (int r = 0; r < all.parts(); ++r) {
    try {
      decode_accumulate(all.part(r), buf, n);
    } catch (const Error& e) {
      CC_THROW(kMalformedPayload, name_, " allreduce on rank ", comm.rank(), ": payload from rank ",
               r, " rejected: ", e.what());
    }
  }
  if (average) scale_in_place(buf, n, comm.size());
  return {payload.size(), info.sent};
}

CostShape SparseAllgatherAllreduce::cost_shape(size_t n, int world_size) const {
  const double payload = kPayloadHeaderBytes + 4 + double(target_count(density_, n)) * bytes_per_entry_;
  return {payload * (world_size - 1), 2, false};  // sizes round, payload round
}

}  // namespace compcoll
