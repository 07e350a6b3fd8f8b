#include "compression/csc.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compcoll/error.h"
#include "compression/accumulate.h"
#include "compression/simd.h"

namespace compcoll {
namespace {

inline size_t chunk_len(uint32_t c, size_t chunk, size_t n) {
  return std::min(chunk, n - size_t{c} * chunk);
}

template <MomentumMode M>
void accumulate_norms(const float* g, float m, float* u, float* v, size_t n, size_t chunk,
                      float* norms) {
  using simd::f32x4;
  const f32x4 mv = simd::splat(m);
  float dummy_u = 0.0f;
  for (size_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
    const size_t c1 = std::min(n, c0 + chunk);
    f32x4 l1 = {};
    size_t i = c0;
    for (; i + simd::kLanes <= c1; i += simd::kLanes) {
      const f32x4 gi = simd::load(g + i);
      const f32x4 inc = momentum_step4<M>(gi, u, i, mv);
      const f32x4 vi = simd::load(v + i) + inc;
      simd::store(v + i, vi);
      l1 += simd::abs(vi);
    }
    float norm = simd::sum(l1);
    for (; i < c1; ++i) {
      float& ui = M == MomentumMode::kNone ? dummy_u : u[i];
      v[i] += momentum_step<M>(g[i], ui, m);
      norm += std::fabs(v[i]);
    }
    norms[c] = norm;
  }
}

}  // namespace

void validate_csc_config(const CscConfig& c) {
  CC_CHECK(c.chunk >= 1, kInvalidArgument, "csc: chunk size ", c.chunk, " must be >= 1");
  CC_CHECK(c.fraction > 0.0 && c.fraction <= 1.0, kInvalidArgument, "csc: chunk fraction ",
           c.fraction, " is outside (0, 1]");
  CC_CHECK(c.momentum >= 0.0f && c.momentum < 1.0f, kInvalidArgument, "csc: momentum ",
           c.momentum, " is outside [0, 1)");
}

std::unique_ptr<CodecState> make_csc_state(const CscConfig& c, size_t n) {
  auto st = std::make_unique<CodecState>(n);
  if (c.momentum > 0.0f) st->u.assign(n, 0.0f);
  return st;
}

size_t csc_chunk_count(size_t n, size_t chunk) { return (n + chunk - 1) / chunk; }

size_t csc_selected_count(size_t chunks, double fraction) {
  return chunks == 0 ? 0 : target_count(fraction, chunks);
}

void csc_accumulate_norms(const CscConfig& c, const float* grad, size_t n, CodecState& st,
                          float* norms) {
  CC_CHECK_EQ(st.size(), n, kInvalidArgument, "csc: state was made for another tensor size");
  dispatch_momentum(momentum_mode(c.momentum, c.nesterov), [&](auto mc) {
    accumulate_norms<decltype(mc)::value>(grad, c.momentum, st.u.data(), st.v.data(), n, c.chunk,
                                          norms);
    return 0;
  });
  ++st.steps;
}

std::vector<uint32_t> csc_select_chunks(const float* norms, size_t chunks, size_t count) {
  // A chunk holding NaN or Inf (its norm is not finite) is always sent, even
  // beyond count: non-finite values must reach the output, not the residual.
  size_t non_finite = 0;
  for (size_t c = 0; c < chunks; ++c) non_finite += !std::isfinite(norms[c]);
  count = std::min(std::max(count, non_finite), chunks);
  std::vector<uint32_t> order(chunks);
  for (size_t i = 0; i < chunks; ++i) order[i] = static_cast<uint32_t>(i);
  auto key = [&](uint32_t c) {
    const float x = norms[c];
    return std::isfinite(x) ? x : INFINITY;  // NaN and Inf rank highest
  };
  std::nth_element(order.begin(), order.begin() + count, order.end(),
                   [&](uint32_t a, uint32_t b) {
                     const float ka = key(a), kb = key(b);
                     return ka > kb || (ka == kb && a < b);
                   });
  order.resize(count);
  std::sort(order.begin(), order.end());
  return order;
}

void csc_pack(const CodecState& st, const std::vector<uint32_t>& chunks, size_t chunk,
              std::vector<float>& packed) {
  const size_t n = st.size();
  size_t total = 0;
  for (uint32_t c : chunks) total += chunk_len(c, chunk, n);
  packed.resize(total);
  size_t off = 0;
  for (uint32_t c : chunks) {
    const size_t len = chunk_len(c, chunk, n);
    std::memcpy(packed.data() + off, st.v.data() + size_t{c} * chunk, len * sizeof(float));
    off += len;
  }
}

void csc_commit(CodecState& st, const std::vector<uint32_t>& chunks, size_t chunk,
                bool masking) {
  const size_t n = st.size();
  for (uint32_t c : chunks) {
    const size_t len = chunk_len(c, chunk, n);
    float* v = st.v.data() + size_t{c} * chunk;
    if (!st.u.empty()) {
      float* u = st.u.data() + size_t{c} * chunk;
      if (masking) {
        std::fill_n(u, len, 0.0f);
      } else {
        // A non-finite value was sent: its velocity restarts, or v += u
        // would bring it back at every later call.
        for (size_t i = 0; i < len; ++i) {
          if (!std::isfinite(v[i]) || !std::isfinite(u[i])) u[i] = 0.0f;
        }
      }
    }
    std::fill_n(v, len, 0.0f);
  }
}

void csc_unpack(const float* packed, const std::vector<uint32_t>& chunks, size_t chunk, size_t n,
                float* out) {
  size_t next = 0, off = 0;  // next: first element not yet written
  for (uint32_t c : chunks) {
    const size_t begin = size_t{c} * chunk;
    const size_t len = chunk_len(c, chunk, n);
    std::fill(out + next, out + begin, 0.0f);
    std::memcpy(out + begin, packed + off, len * sizeof(float));
    off += len;
    next = begin + len;
  }
  std::fill(out + next, out + n, 0.0f);
}

}  // namespace compcoll
