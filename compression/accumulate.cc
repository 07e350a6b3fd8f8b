#include "compression/accumulate.h"

#include "compcoll/error.h"
#include "compression/codec.h"

namespace compcoll {

double l2_norm(const float* g, size_t n) {
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += double(g[i + j]) * g[i + j];
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += double(g[i]) * g[i];
  for (double l : lanes) sum += l;
  return std::sqrt(sum);
}

double finite_l2_norm(const float* g, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(g[i])) sum += double(g[i]) * g[i];
  }
  return std::sqrt(sum);
}

float clip_scale(const float* g, size_t n, float clip, int world_size) {
  if (!(clip > 0.0f) || n == 0) return 1.0f;
  const double limit = clip / std::sqrt(static_cast<double>(world_size < 1 ? 1 : world_size));
  double norm = l2_norm(g, n);
  // A non-finite element reaches the output as it is, and never the
  // residual: the finite rest is clipped by its own norm, as it would be
  // without it (the second pass is paid only then).
  if (!std::isfinite(norm)) norm = finite_l2_norm(g, n);
  if (!std::isfinite(norm) || norm <= limit) return 1.0f;
  return static_cast<float>(limit / norm);
}

size_t target_count(double density, size_t n) {
  if (n == 0) return 0;
  const double k = std::round(density * static_cast<double>(n));
  return k < 1.0 ? 1 : (k > double(n) ? n : static_cast<size_t>(k));
}

void add_addends(float* grad, const Addends& addends) {
  float* out = grad + addends.off;
  for (const float* in : addends.parts) {
    for (size_t i = 0; i < addends.len; ++i) out[i] += in[i];
  }
}

EncodeInfo encode_with_addends(const SparseCodec& codec, float* grad, const Addends& addends,
                               size_t n, CodecState& state, Bytes& payload) {
  if (addends.empty()) return codec.encode(grad, n, state, payload);
  if (codec.fuses_addends()) return codec.encode_sum(grad, addends, n, state, payload);
  add_addends(grad, addends);
  return codec.encode(grad, n, state, payload);
}

EncodeInfo SparseCodec::encode_sum(const float*, const Addends&, size_t, CodecState&,
                                   Bytes&) const {
  CC_THROW(kInternal, name(), ": encode_sum() where the codec does not fuse addends");
}

}  // namespace compcoll
