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
  // Branch-free and without a pointer chosen per element, so that GCC
  // vectorises it (sqrt and division included, -fno-math-errno).
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    float inc = gi;
    if constexpr (M != MomentumMode::kNone) {
      float ui = u[i];
      inc = momentum_step<M>(gi, ui, m);
      u[i] = ui;
    }
    const float x = v[i] + inc;
    v[i] = x;
    // NaN and Inf fail the test and leave s as it was.
    const float g2 = std::min(gi * gi, kMax);
    const float updated = std::min(beta * s[i] + rest * g2, kMax);
    const float si = std::fabs(gi) <= kMax ? updated : s[i];
    s[i] = si;
    view[i] = x / std::sqrt(si + kTiny);
  }
}

}  // namespace

std::unique_ptr<float[]> accumulate_normalized(MomentumMode mode, const float* g, float scale,
                                               float m, CodecState& st, float beta, size_t n) {
  if (st.second_moment.size() != n) st.second_moment.assign(n, 0.0f);
  std::unique_ptr<float[]> view(new float[n]);
  float* u = st.u.data();
  float* v = st.v.data();
  float* s = st.second_moment.data();
  dispatch_momentum(mode, [&](auto mc) {
    accumulate_normalized_impl<decltype(mc)::value>(g, scale, m, u, v, s, beta, view.get(), n);
    return 0;
  });
  return view;
}

}  // namespace compcoll
