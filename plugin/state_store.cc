#include "plugin/state_store.h"

#include <sstream>

namespace compcoll {

std::string StateKey::str() const {
  if (!explicit_key.empty()) return "key:" + explicit_key;
  std::ostringstream os;
  os << "addr:0x" << std::hex << address << std::dec << "/" << count << "/" << dtype_name(dtype);
  return os.str();
}

CodecState& StateStore::get(const StateKey& key, size_t count,
                            const std::function<std::unique_ptr<CodecState>()>& make,
                            bool* created) {
  const std::string k = key.str();
  auto it = entries_.find(k);
  *created = it == entries_.end() || it->second.state->size() != count;
  if (*created) {
    entries_[k] = Entry{make(), now_};
    it = entries_.find(k);
  }
  it->second.last_used = now_;
  return *it->second.state;
}

size_t StateStore::tick() {
  ++now_;
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (now_ - it->second.last_used > evict_after_) {
      it = entries_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

size_t StateStore::memory_bytes() const {
  size_t b = 0;
  for (const auto& [k, e] : entries_) b += e.state->memory_bytes();
  return b;
}

}  // namespace compcoll
