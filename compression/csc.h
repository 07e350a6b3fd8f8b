// Coarse-grained sparse communication (CSC, GradientFlow) on one rank.
//
// The accumulated gradient v is cut into fixed chunks of `chunk` elements
// (the last may be shorter). One fused pass adds the gradient (with optional
// momentum correction) and computes each chunk's L1 norm. The collective
// allreduces the norm vector, so every rank sees the same norms and picks the
// same top `fraction` of chunks (ties to the lower index; a NaN norm ranks
// highest so non-finite values reach the output). Only those chunks travel,
// packed back to back, in a dense allreduce: no indices, and the volume does
// not grow with the rank count. Unselected chunks stay in the residual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compression/codec.h"

namespace compcoll {

struct CscConfig {
  size_t chunk = 16384;    // elements per chunk
  double fraction = 0.01;  // share of chunks sent per step, in (0, 1]
  float momentum = 0.0f;   // optional momentum correction, as dgc
  bool nesterov = false;
  bool masking = true;     // momentum factor masking of sent chunks, as dgc
};

void validate_csc_config(const CscConfig& c);
std::unique_ptr<CodecState> make_csc_state(const CscConfig& c, size_t n);

size_t csc_chunk_count(size_t n, size_t chunk);
size_t csc_selected_count(size_t chunks, double fraction);

// v += (momentum-corrected) grad; norms[c] = L1 norm of v's chunk c.
// norms must hold csc_chunk_count(n, chunk) floats.
void csc_accumulate_norms(const CscConfig& c, const float* grad, size_t n, CodecState& st,
                          float* norms);

// The `count` chunks with the largest norms, sorted by index.
std::vector<uint32_t> csc_select_chunks(const float* norms, size_t chunks, size_t count);

// Copies the selected chunks of v back to back into packed (resized).
void csc_pack(const CodecState& st, const std::vector<uint32_t>& chunks, size_t chunk,
              std::vector<float>& packed);

// What was sent leaves the residual: zeroes v (and u, momentum factor
// masking, when masking) in the selected chunks.
void csc_commit(CodecState& st, const std::vector<uint32_t>& chunks, size_t chunk,
                bool masking = true);

// out = 0 except the selected chunks, which take the packed values.
void csc_unpack(const float* packed, const std::vector<uint32_t>& chunks, size_t chunk, size_t n,
                float* out);

}  // namespace compcoll
