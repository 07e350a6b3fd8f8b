#include "collectives/onebit_allreduce.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <vector>

#include "collectives/dense.h"
#include "collectives/owner_rejection.h"
#include "compcoll/error.h"
#include "compression/decode.h"

namespace compcoll {

OneBitAllreduce::OneBitAllreduce(const OneBitConfig& config, int warmup_steps)
    : config_(config), warmup_steps_(warmup_steps) {
  validate_onebit_config(config);
  CC_CHECK(warmup_steps >= 0, kInvalidArgument, "onebit: warm-up steps ", warmup_steps,
           " must be >= 0");
}

OneBitAllreduce::Shard OneBitAllreduce::shard(size_t n, int world_size, int r) const {
  const size_t blocks = (n + config_.block - 1) / config_.block;
  const size_t per = (blocks + world_size - 1) / world_size;
  const size_t begin = std::min(n, size_t(r) * per * config_.block);
  const size_t end = std::min(n, size_t(r + 1) * per * config_.block);
  return {begin, end - begin};
}

std::unique_ptr<CodecState> OneBitAllreduce::make_state(size_t n, int world_size) const {
  auto st = std::make_unique<CodecState>(n);
  // The rank is not known here; every shard but the last has the same
  // length, so size the server error for the largest and use a prefix.
  st->u.assign(shard(n, world_size, 0).len, 0.0f);
  return st;
}

CallInfo OneBitAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                    CodecState& state) const {
  const int R = comm.size(), me = comm.rank();
  CC_CHECK_EQ(state.size(), n, kInvalidArgument, "onebit: state was made for another tensor size");
  const uint64_t step = state.steps++;
  if (step < static_cast<uint64_t>(warmup_steps_)) {
    // Warm-up: exact, and the error memories stay empty.
    dense_allreduce(comm, buf, n, DType::kFloat32, average ? ReduceOp::kAvg : ReduceOp::kSum);
    decision_.set(warmup_decision(step, warmup_steps_));
    return {ring_allreduce_bytes(n * sizeof(float), R), n};
  }
  decision_.set("compressed");
  // Stage 1: quantize every shard with the worker error, send shard j to j.
  std::vector<Bytes> send(R);
  for (int j = 0; j < R; ++j) {
    const Shard s = shard(n, R, j);
    onebit_encode(config_, buf + s.begin, state.v.data() + s.begin, s.len, send[j]);
  }
  size_t sent_bytes = 0;
  for (int j = 0; j < R; ++j) sent_bytes += j == me ? 0 : send[j].size();
  // Every shard is at most the first one's length (the last may be shorter).
  const size_t max_part = max_payload_bytes(shard(n, R, 0).len);
  const std::vector<Bytes> recv = comm.alltoallv(send, max_part);

  // Stage 2: sum my shard over ranks (rank order), add the server error,
  // re-quantize.
  const Shard mine = shard(n, R, me);
  CC_CHECK_LE(mine.len, state.u.size(), kInvalidArgument,
              "onebit: server-error state is too small for this rank's shard");
  std::vector<float> sum(mine.len, 0.0f);
  // A shard part refused here is known to this rank alone: it still joins
  // stage 3, with a marker instead of its shard (owner_rejection.h).
  std::exception_ptr refused;
  Bytes quantized;
  for (int i = 0; i < R && !refused; ++i) {
    try {
      onebit_decode(recv[i], sum.data(), mine.len, /*accumulate=*/true);
    } catch (const Error& e) {
      try {
        CC_THROW(kMalformedPayload, "onebit allreduce on rank ", me, ": shard payload from rank ",
                 i, " rejected: ", e.what());
      } catch (...) {
        refused = std::current_exception();
        quantized = rejection_marker(i);
      }
    }
  }
  if (!refused) onebit_encode(config_, sum.data(), state.u.data(), mine.len, quantized);

  // Stage 3: everyone gets every quantized shard.
  const Gathered all = comm.allgatherv(quantized, std::max(max_part, kRejectionBytes));
  for (int j = 0; j < R; ++j) {
    if (const std::optional<int> sender = rejected_sender(all.part(j))) {
      // What this rank sent in stage 1 goes back into its worker error, so
      // that error + sent = its input: nothing of the stopped call is lost.
      for (int k = 0; k < R; ++k) {
        const Shard s = shard(n, R, k);
        onebit_decode(send[k], state.v.data() + s.begin, s.len, /*accumulate=*/true);
      }
      if (refused) std::rethrow_exception(refused);
      throw_owner_rejection("onebit", comm, j, *sender);
    }
  }
  for (int j = 0; j < R; ++j) {
    const Shard s = shard(n, R, j);
    try {
      onebit_decode(all.part(j), buf + s.begin, s.len, /*accumulate=*/false);
    } catch (const Error& e) {
      CC_THROW(kMalformedPayload, "onebit allreduce on rank ", me, ": quantized shard from rank ", j,
               " rejected: ", e.what());
    }
  }
  if (average) scale_in_place(buf, n, R);
  return {sent_bytes + quantized.size() * size_t(R - 1), n};
}

CostShape OneBitAllreduce::cost_shape(size_t n, int world_size) const {
  // alltoallv of (R-1)/R of the signs, allgatherv of our shard to R-1
  // peers: one round each (GlooComm sends the sizes with the parts).
  const double bits = double(onebit_payload_bytes(n, config_));
  const double share = world_size > 1 ? double(world_size - 1) / world_size : 0.0;
  return {2.0 * share * bits, 2, false};
}

}  // namespace compcoll
