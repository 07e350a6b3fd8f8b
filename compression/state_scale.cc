#include "compression/state_scale.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "compcoll/error.h"

namespace compcoll {
namespace {

void scale(std::vector<float>& x, float factor) {
  for (float& e : x) e *= factor;
}

}  // namespace

void rescale_codec_state(CodecState& state, float factor) {
  CC_CHECK(std::isfinite(factor) && factor > 0.0f, kInvalidArgument,
           "an error-feedback state can only be rescaled by a finite factor > 0, got ", factor);
  if (factor == 1.0f) return;
  state.bring_to_host();
  scale(state.v, factor);
  scale(state.u, factor);
  scale(state.handed, factor);
  scale(state.second_moment, factor * factor);
}

bool snapshot_codec_state(const CodecState& state, CodecState& into) {
  if (state.device) return false;
  // assign() keeps the capacity into already has.
  into.v.assign(state.v.begin(), state.v.end());
  into.u.assign(state.u.begin(), state.u.end());
  into.handed.assign(state.handed.begin(), state.handed.end());
  into.second_moment.assign(state.second_moment.begin(), state.second_moment.end());
  into.regions.assign(state.regions.begin(), state.regions.end());
  into.steps = state.steps;
  into.lambda = state.lambda;
  return true;
}

void restore_codec_state(CodecState& state, CodecState& snapshot) {
  state.device.reset();
  state.v.swap(snapshot.v);
  state.u.swap(snapshot.u);
  state.handed.swap(snapshot.handed);
  state.second_moment.swap(snapshot.second_moment);
  state.regions.swap(snapshot.regions);
  state.steps = snapshot.steps;
  state.lambda = snapshot.lambda;
}

namespace {

// Non-finite iff every exponent bit is set.
template <typename Bits>
bool exponents_finite(const void* data, size_t n, Bits exponent) {
  const auto* x = static_cast<const Bits*>(data);
  Bits all_set = 0;  // any element with every exponent bit set leaves them set here
  for (size_t i = 0; i < n; ++i) all_set |= static_cast<Bits>((x[i] & exponent) == exponent);
  return all_set == 0;
}

}  // namespace

bool all_finite(const void* data, size_t n, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return exponents_finite<uint32_t>(data, n, 0x7F800000u);
    case DType::kFloat16:
      return exponents_finite<uint16_t>(data, n, 0x7C00u);
    case DType::kBFloat16:
      return exponents_finite<uint16_t>(data, n, 0x7F80u);
    default:
      CC_THROW(kInvalidArgument, "all_finite: ", dtype_name(dtype), " is not a floating type");
  }
}

}  // namespace compcoll
