#include "collectives/chunked_norm.h"

#include <algorithm>
#include <vector>

#include "compcoll/error.h"

namespace compcoll {

ChunkedNormAllreduce::ChunkedNormAllreduce(const CscConfig& config, int warmup_steps,
                                           bool warmup_masking)
    : config_(config), warmup_steps_(warmup_steps), warmup_masking_(warmup_masking) {
  validate_csc_config(config);
  CC_CHECK(warmup_steps >= 0, kInvalidArgument, "csc: warm-up steps ", warmup_steps,
           " must be >= 0");
}

std::unique_ptr<CodecState> ChunkedNormAllreduce::make_state(size_t n, int) const {
  return make_csc_state(config_, n);
}

CallInfo ChunkedNormAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                         CodecState& state) const {
  return run(comm, buf, n, average, state, false);
}

CallInfo ChunkedNormAllreduce::allreduce_listing_support(Comm& comm, float* buf, size_t n,
                                                         bool average, CodecState& state) const {
  return run(comm, buf, n, average, state, true);
}

CallInfo ChunkedNormAllreduce::run(Comm& comm, float* buf, size_t n, bool average,
                                   CodecState& state, bool list_support) const {
  const size_t chunks = csc_chunk_count(n, config_.chunk);
  const uint64_t step = state.steps;  // csc_accumulate_norms counts this call
  const bool warm_up = step < static_cast<uint64_t>(warmup_steps_);
  std::vector<float> norms(chunks);
  csc_accumulate_norms(config_, buf, n, state, norms.data());
  if (warm_up) {
    decision_.set(warmup_decision(step, warmup_steps_));
  }
  const size_t keep = warm_up ? chunks : csc_selected_count(chunks, config_.fraction);
  if (!warm_up) {
    // At least one chunk is sent: a tensor of a few chunks sends a larger
    // share than COMPCOLL_CSC_FRACTION, and one of one chunk sends all of it
    // (said, so that "compressed" is not read as a ratio it did not have).
    decision_.set(keep >= chunks ? detail::concat("compressed in name only: ", keep, " of ",
                                                  chunks, chunks == 1 ? " chunk" : " chunks",
                                                  " (the whole tensor; COMPCOLL_CSC_CHUNK is ",
                                                  config_.chunk, " elements)")
                                 : detail::concat("compressed: ", keep, " of ", chunks, " chunks"));
    // The norms only choose chunks: the warm-up selects them all.
    if (chunks > 0) comm.allreduce(norms.data(), chunks, DType::kFloat32, ReduceOp::kSum);
  }
  const std::vector<uint32_t> selected = csc_select_chunks(norms.data(), chunks, keep);
  std::vector<float> packed;
  csc_pack(state, selected, config_.chunk, packed);
  csc_commit(state, selected, config_.chunk, warm_up ? warmup_masking_ : config_.masking);
  if (!packed.empty()) {
    comm.allreduce(packed.data(), packed.size(), DType::kFloat32, ReduceOp::kSum);
  }
  if (average) scale_in_place(packed.data(), packed.size(), comm.size());
  csc_unpack(packed.data(), selected, config_.chunk, n, buf);
  CallInfo info{(packed.size() + (warm_up ? 0 : chunks)) * sizeof(float), packed.size()};
  // Outside the selected chunks the result is zero. A longer list than n/8
  // would cost more than the scan it saves (and is never shared sparse).
  if (list_support && packed.size() <= n / 8) {
    std::vector<uint32_t>& support = info.support.emplace();
    support.reserve(packed.size());
    for (const uint32_t c : selected) {
      const size_t begin = size_t{c} * config_.chunk, end = std::min(n, begin + config_.chunk);
      for (size_t i = begin; i < end; ++i) support.push_back(static_cast<uint32_t>(i));
    }
  }
  return info;
}

CostShape ChunkedNormAllreduce::cost_shape(size_t n, int world_size) const {
  const size_t chunks = csc_chunk_count(n, config_.chunk);
  const double floats = double(chunks) + double(csc_selected_count(chunks, config_.fraction)) *
                                             double(std::min(n, config_.chunk));
  const double ring = world_size > 1 ? 2.0 * (world_size - 1) / world_size : 0.0;
  return {ring * 4.0 * floats, 2, true};  // two ring allreduces
}

}  // namespace compcoll
