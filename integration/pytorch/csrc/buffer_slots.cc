#include "integration/pytorch/csrc/buffer_slots.h"

#include <functional>

namespace compcoll::torch_integration {

const char* slot_event_name(SlotEvent e) {
  switch (e) {
    case SlotEvent::kSame: return "same";
    case SlotEvent::kNew: return "new";
    case SlotEvent::kCarried: return "carried";
    case SlotEvent::kFresh: return "fresh";
    case SlotEvent::kResized: return "resized";
  }
  return "?";
}

std::string BufferSlots::Slot::key() const {
  return "t" + std::to_string(id) + "." + std::to_string(generation);
}

size_t BufferSlots::BufferIdHash::operator()(const BufferId& b) const {
  size_t h = std::hash<const void*>()(b.storage);
  h = h * 31 + std::hash<int64_t>()(b.offset);
  h = h * 31 + std::hash<int64_t>()(b.numel);
  return h * 31 + std::hash<int>()(b.dtype);
}

BufferSlots::BufferId BufferSlots::id_of(const Slot& s) {
  // The StorageImpl object outlives its data while a weak reference exists,
  // so its address identifies it for as long as the slot holds it.
  return {s.storage._unsafe_get_target(), s.offset, s.numel, static_cast<int>(s.dtype)};
}

SlotAssignment BufferSlots::record(Slot& s, SlotEvent e, int64_t dropped) {
  s.last_use = ++clock_;
  ++s.uses;
  trace_.push_back({s.key(), s.numel, e});
  if (trace_.size() > kTraceLength) trace_.pop_front();
  return {s.key(), e, dropped};
}

void BufferSlots::note_follows(Slot& s) {
  const Slot* last = nullptr;  // the slot of this shape reduced most recently
  for (const Slot& o : slots_) {
    if (&o == &s || o.numel != s.numel || o.dtype != s.dtype) continue;
    if (last == nullptr || o.last_use > last->last_use) last = &o;
  }
  const bool follows = last != nullptr && last->live();
  s.follows = follows ? last->id : -1;
  s.follows_use = follows ? last->last_use : 0;
}

bool BufferSlots::followed_since_last_use(const Slot& taken) const {
  for (const Slot& o : slots_) {
    if (&o != &taken && o.live() && o.follows == taken.id && o.follows_use == taken.last_use) {
      return true;
    }
  }
  return false;
}

SlotAssignment BufferSlots::assign(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  const BufferId id{storage.unsafeGetStorageImpl(), t.storage_offset(), t.numel(),
                    static_cast<int>(t.scalar_type())};

  // 1. A live buffer keeps its slot. The map entry may belong to a dead
  //    slot whose StorageImpl address was reused, so check liveness.
  if (auto it = by_buffer_.find(id); it != by_buffer_.end()) {
    Slot& s = slots_[it->second];
    if (s.live()) return record(s, SlotEvent::kSame, 0);
    by_buffer_.erase(it);
  }

  // 2. Take over the least recently used dead slot, same shape first.
  Slot* same = nullptr;
  Slot* other = nullptr;
  for (Slot& s : slots_) {
    if (s.live()) continue;
    const bool same_shape = s.numel == t.numel() && s.dtype == t.scalar_type();
    Slot*& best = same_shape ? same : other;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  Slot* pick = same ? same : other;
  SlotEvent event = SlotEvent::kNew;
  int64_t dropped = 0;
  int before = 0;
  std::string dropped_key;
  bool overlapped = false;
  if (pick != nullptr) {
    by_buffer_.erase(id_of(*pick));
    if (pick == same) {
      overlapped = followed_since_last_use(*pick);
      overlapped_ += overlapped ? 1 : 0;
      pick->overlapped += overlapped ? 1 : 0;
      if (pick->replacements == 0) {
        dropped_key = pick->key();
        ++pick->generation;  // new key: the Communicator makes a fresh state
        event = SlotEvent::kFresh;
        dropped = pick->numel;
      } else {
        event = SlotEvent::kCarried;
      }
    } else {
      // Same key, another count or dtype: the state is dropped explicitly
      // (the Communicator would replace one of another count by itself, but
      // not one of the same count in another dtype).
      event = SlotEvent::kResized;
      pick->overlapped = 0;  // counted per shape: the slot now serves another tensor
      dropped = pick->numel;
      dropped_key = pick->key();
    }
    before = pick->replacements++;
  } else {
    slots_.emplace_back();
    pick = &slots_.back();
    pick->id = static_cast<int>(slots_.size()) - 1;
  }
  pick->storage = storage.getWeakStorageImpl();
  pick->offset = t.storage_offset();
  pick->numel = t.numel();
  pick->dtype = t.scalar_type();
  note_follows(*pick);
  by_buffer_[id_of(*pick)] = static_cast<size_t>(pick - slots_.data());
  SlotAssignment a = record(*pick, event, dropped);
  a.dropped_key = std::move(dropped_key);
  a.replacements = before;
  a.overlapped = overlapped;
  return a;
}

std::vector<SlotInfo> BufferSlots::slots() const {
  std::vector<SlotInfo> out;
  out.reserve(slots_.size());
  for (const Slot& s : slots_) {
    out.push_back({s.key(), s.numel, std::string(c10::toString(s.dtype)), s.live(),
                   s.replacements, s.uses, s.overlapped});
  }
  return out;
}

}  // namespace compcoll::torch_integration
