#include "collectives/chunked_norm.h"

#include <algorithm>
#include <vector>

namespace compcoll {

ChunkedNormAllreduce::ChunkedNormAllreduce(const CscConfig& config) : config_(config) {
  validate_csc_config(config);
}

std::unique_ptr<CodecState> ChunkedNormAllreduce::make_state(size_t n, int) const {
  return make_csc_state(config_, n);
}

CallInfo ChunkedNormAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                         CodecState& state) const {
  const size_t chunks = csc_chunk_count(n, config_.chunk);
  std::vector<float> norms(chunks);
  csc_accumulate_norms(config_, buf, n, state, norms.data());
  if (chunks > 0) comm.allreduce(norms.data(), chunks, DType::kFloat32, ReduceOp::kSum);
  const std::vector<uint32_t> selected =
      csc_select_chunks(norms.data(), chunks, csc_selected_count(chunks, config_.fraction));
  std::vector<float> packed;
  csc_pack(state, selected, config_.chunk, packed);
  csc_commit(state, selected, config_.chunk, config_.masking);
  if (!packed.empty()) {
    comm.allreduce(packed.data(), packed.size(), DType::kFloat32, ReduceOp::kSum);
  }
  if (average) scale_in_place(packed.data(), packed.size(), comm.size());
  csc_unpack(packed.data(), selected, config_.chunk, n, buf);
  return {(packed.size() + chunks) * sizeof(float), packed.size()};
}

CostShape ChunkedNormAllreduce::cost_shape(size_t n, int world_size) const {
  const size_t chunks = csc_chunk_count(n, config_.chunk);
  const double floats = double(chunks) + double(csc_selected_count(chunks, config_.fraction)) *
                                             double(std::min(n, config_.chunk));
  const double ring = world_size > 1 ? 2.0 * (world_size - 1) / world_size : 0.0;
  return {ring * 4.0 * floats, 2, true};  // two ring allreduces
}

}  // namespace compcoll
