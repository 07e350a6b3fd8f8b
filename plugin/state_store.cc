#include "plugin/state_store.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "compression/state_merge.h"
#include "compression/state_scale.h"

namespace compcoll {

std::string StateKey::str() const {
  if (!explicit_key.empty()) return "key:" + explicit_key;
  std::ostringstream os;
  os << "addr:0x" << std::hex << address << std::dec << "/" << count << "/" << dtype_name(dtype);
  return os.str();
}

CodecState& StateStore::get(const StateKey& key, size_t count,
                            const std::function<std::unique_ptr<CodecState>()>& make,
                            Got* got) {
  const std::string k = key.str();
  used_since_tick_ = true;
  auto it = entries_.find(k);
  *got = Got::kExisting;
  if (it == entries_.end() || it->second.state->size() != count) {
    const auto aside = aside_.find(k);
    if (aside != aside_.end() && aside->second.state->size() == count) {
      // The restored entry kept aside by a call of another size: its own
      // size is back. (What that call used is dropped, as it would be.)
      entries_[k] = std::move(aside->second);
      aside_.erase(aside);
      *got = Got::kBackFromAside;
    } else {
      // Made first: a make() that throws (an allocation) leaves the store
      // as it was, not a key without a state.
      std::unique_ptr<CodecState> fresh = make();
      *got = it == entries_.end() ? Got::kNew : Got::kReplaced;
      if (it != entries_.end() && it->second.restored_unclaimed) {
        if (aside != aside_.end()) ++restored_dropped_;  // one aside per key
        aside_[k] = std::move(it->second);
        *got = Got::kKeptAside;
      }
      entries_[k] = Entry{std::move(fresh), now_};
    }
    it = entries_.find(k);
  }
  it->second.last_used = now_;
  it->second.restored_unclaimed = false;
  return *it->second.state;
}

namespace {

// Whether a state holds error feedback not sent yet, and its residual's L1 norm.
bool holds_unsent(const CodecState& s, double* residual_l1) {
  if (s.device) return true;  // not read back to find out: counted as holding
  double l1 = 0.0;
  bool any = false;
  for (const float x : s.v) {
    l1 += std::fabs(static_cast<double>(x));
    any = any || x != 0.0f;
  }
  for (const float x : s.u) any = any || x != 0.0f;
  *residual_l1 += l1;
  return any;
}

}  // namespace

StateStore::Evicted StateStore::tick() {
  Evicted out;
  if (!used_since_tick_) return out;
  used_since_tick_ = false;
  ++now_;
  for (auto* map : {&entries_, &aside_}) {
    for (auto it = map->begin(); it != map->end();) {
      if (now_ - it->second.last_used > evict_after_) {
        restored_dropped_ += it->second.restored_unclaimed;
        ++out.entries;
        if (holds_unsent(*it->second.state, &out.residual_l1)) {
          ++out.holding;
          if (out.keys.size() < kKeysNamed) out.keys.push_back(it->first);
        }
        it = map->erase(it);
      } else {
        ++it;
      }
    }
  }
  return out;
}

StateStore::Merge StateStore::merge(const StateKey& from, const StateKey& into) {
  const auto src = entries_.find(from.str());
  if (src == entries_.end()) return Merge::kNoSource;
  Entry older = std::move(src->second);
  entries_.erase(src);
  const auto dst = entries_.find(into.str());
  if (dst == entries_.end()) {
    entries_[into.str()] = std::move(older);
    return Merge::kMoved;
  }
  // The merge adds host vectors.
  older.state->bring_to_host();
  dst->second.state->bring_to_host();
  return merge_codec_state(*older.state, *dst->second.state) ? Merge::kMerged
                                                             : Merge::kSizeMismatch;
}

bool StateStore::restored_unclaimed(const StateKey& key) const {
  const auto it = entries_.find(key.str());
  return it != entries_.end() && it->second.restored_unclaimed;
}

const CodecState* StateStore::find(const StateKey& key) const {
  const auto it = entries_.find(key.str());
  return it == entries_.end() ? nullptr : it->second.state.get();
}

void StateStore::bring_to_host() {
  for (auto* map : {&entries_, &aside_}) {
    for (auto& [k, e] : *map) e.state->bring_to_host();
  }
}

size_t StateStore::rescale(float factor) {
  // Kept-aside entries too: they come back in the gradients' new unit.
  for (auto* map : {&entries_, &aside_}) {
    for (auto& [k, e] : *map) rescale_codec_state(*e.state, factor);
  }
  return entries_.size() + aside_.size();
}

std::vector<StateStore::Saved> StateStore::saved() const {
  std::vector<Saved> out;
  out.reserve(entries_.size() + aside_.size());
  for (const auto& [k, e] : entries_) {
    if (aside_.count(k) == 0) out.push_back({&k, e.state.get(), now_ - e.last_used});
  }
  // In its key's place (see the header); an aside entry whose key's entry
  // was evicted meanwhile is saved too.
  for (const auto& [k, e] : aside_) out.push_back({&k, e.state.get(), now_ - e.last_used});
  std::sort(out.begin(), out.end(), [](const Saved& a, const Saved& b) { return *a.key < *b.key; });
  return out;
}

void StateStore::put(const std::string& key_text, std::unique_ptr<CodecState> state, uint64_t idle) {
  // An entry already idle in the checkpointed run would have been evicted
  // there too, at the same call: dropping it unused is no partial resume.
  const bool awaited = idle <= kRecentlyUsedCalls;
  entries_[key_text] = Entry{std::move(state), idle <= now_ ? now_ - idle : 0, awaited};
}

std::vector<float>& StateStore::order_mirror(const std::string& order_key, size_t n,
                                             std::vector<float>& seed) {
  used_since_tick_ = true;
  Entry& e = entries_["order:" + order_key];
  if (!e.state) e.state = std::make_unique<CodecState>(0);
  if (e.state->handed.size() != n) {
    if (seed.size() == n) {
      e.state->handed.swap(seed);
    } else {
      e.state->handed.assign(n, 0.0f);
    }
  }
  e.last_used = now_;
  e.restored_unclaimed = false;
  return e.state->handed;
}

size_t StateStore::memory_bytes() const {
  size_t b = 0;
  for (const auto* map : {&entries_, &aside_}) {
    for (const auto& [k, e] : *map) b += e.state->memory_bytes();
  }
  return b;
}

}  // namespace compcoll
