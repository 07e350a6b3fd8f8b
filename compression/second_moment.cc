#include "compression/second_moment.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace compcoll {
namespace {

// Keeps 1/sqrt(s) finite where an element's gradient has been zero so far
// (its v is zero too, so its key stays zero).
constexpr float kTiny = 1e-30f;

template <MomentumMode M>
void accumulate_normalized_impl(const float* g, float scale, float m, float* u, float* v,
                                float* s, float beta, float* view, size_t n) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float rest = 1.0f - beta;
  float dummy_u = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    float& ui = M == MomentumMode::kNone ? dummy_u : u[i];
    const float x = v[i] + momentum_step<M>(gi, ui, m);
    v[i] = x;
    // NaN and Inf fail the test and leave s as it was.
    const bool finite = std::fabs(gi) <= kMax;
    const float si = finite ? std::min(beta * s[i] + rest * std::min(gi * gi, kMax), kMax) : s[i];
    s[i] = si;
    view[i] = x / std::sqrt(si + kTiny);
  }
}

}  // namespace

void accumulate_normalized(MomentumMode mode, const float* g, float scale, float m,
                           CodecState& st, float beta, float* view, size_t n) {
  if (st.second_moment.size() != n) st.second_moment.assign(n, 0.0f);
  float* u = st.u.data();
  float* v = st.v.data();
  float* s = st.second_moment.data();
  dispatch_momentum(mode, [&](auto mc) {
    accumulate_normalized_impl<decltype(mc)::value>(g, scale, m, u, v, s, beta, view, n);
    return 0;
  });
}

}  // namespace compcoll
