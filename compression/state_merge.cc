#include "compression/state_merge.h"

#include <utility>

namespace compcoll {

namespace {

void add_into(const std::vector<float>& from, std::vector<float>& into) {
  if (from.empty()) return;
  if (into.empty()) {
    into = from;
    return;
  }
  for (size_t i = 0; i < into.size(); ++i) into[i] += from[i];
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
  add_into(older.v, newer.v);
  add_into(older.u, newer.u);
  newer.steps += older.steps;
  keep_newer(older.handed, newer.handed);
  keep_newer(older.second_moment, newer.second_moment);
  keep_newer(older.regions, newer.regions);
  if (newer_unused) newer.lambda = older.lambda;
  return true;
}

}  // namespace compcoll
