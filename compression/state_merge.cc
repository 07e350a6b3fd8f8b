#include "compression/state_merge.h"

#include <utility>

namespace compcoll {

namespace {

// into = into + from (weight 1) or (into + from) / 2 (weight 0.5); an empty
// side contributes nothing and the other is kept as it is.
void combine_into(const std::vector<float>& from, std::vector<float>& into, float weight) {
  if (from.empty()) return;
  if (into.empty()) {
    into = from;
    return;
  }
  for (size_t i = 0; i < into.size(); ++i) into[i] = (into[i] + from[i]) * weight;
}

template <typename T>
void keep_newer(std::vector<T>& older, std::vector<T>& newer) {
  if (newer.empty()) newer = std::move(older);
}

}  // namespace

bool merge_codec_state(CodecState& older, CodecState& newer) {
  if (older.size() != newer.size()) return false;
  // Optional vectors are either empty or of the tensor's size.
  if (!older.u.empty() && !newer.u.empty() && older.u.size() != newer.u.size()) return false;
  const bool newer_unused = newer.steps == 0;
  combine_into(older.v, newer.v, 1.0f);
  combine_into(older.u, newer.u, 0.5f);
  newer.steps += older.steps;
  keep_newer(older.handed, newer.handed);
  keep_newer(older.second_moment, newer.second_moment);
  keep_newer(older.regions, newer.regions);
  if (newer_unused) newer.lambda = older.lambda;
  return true;
}

}  // namespace compcoll
