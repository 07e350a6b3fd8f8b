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

SlotAssignment BufferSlots::record(Slot& s, SlotEvent e, int64_t dropped, uint64_t pass) {
  s.last_use = ++clock_;
  s.last_pass = pass;
  s.shape_call = ++shape_calls_[shape_of(s)];
  ++s.uses;
  ++s.buffer_uses;
  trace_.push_back({s.key(), s.numel, e});
  if (trace_.size() > kTraceLength) trace_.pop_front();
  return {s.key(), e, dropped};
}

void BufferSlots::note_follows(Slot& s) {
  const Slot* last = nullptr;  // the slot of this shape reduced most recently
  for (const Slot& o : slots_) {
    if (&o == &s || shape_of(o) != shape_of(s)) continue;
    if (last == nullptr || o.last_use > last->last_use) last = &o;
  }
  const bool follows = last != nullptr && last->live();
  s.follows = follows ? last->id : -1;
  s.follows_use = follows ? last->last_use : 0;
}

BufferSlots::Slot* BufferSlots::follower_since_last_use(const Slot& taken) {
  // Exactly one call of this shape since taken's last: the follower's. With
  // more (m tensors of one shape, each reallocated with overlap), the slot
  // attached after taken's call belongs to another tensor.
  if (shape_calls_[shape_of(taken)] != taken.shape_call + 1) {
    return nullptr;
  }
  for (Slot& o : slots_) {
    if (&o != &taken && o.live() && o.follows == taken.id && o.follows_use == taken.last_use) {
      return &o;
    }
  }
  return nullptr;
}

SlotAssignment BufferSlots::assign(const at::Tensor& t, uint64_t pass, uint64_t owner) {
  const c10::Storage& storage = t.storage();
  const BufferId id{storage.unsafeGetStorageImpl(), t.storage_offset(), t.numel(),
                    static_cast<int>(t.scalar_type())};

  // 1. A live buffer keeps its slot. The map entry may belong to a dead
  //    slot whose StorageImpl address was reused, so check liveness.
  if (auto it = by_buffer_.find(id); it != by_buffer_.end()) {
    Slot& s = slots_[it->second];
    if (s.live()) return record(s, SlotEvent::kSame, 0, pass);
    by_buffer_.erase(it);
  }
  const auto same_shape = [&](const Slot& s) {
    return s.numel == t.numel() && s.dtype == t.scalar_type();
  };
  // Another owner's slot is never a candidate below.
  const auto others = [&](const Slot& s) { return s.owner != owner; };

  // A reallocated tensor's chain (see the top of buffer_slots.h): a new
  // buffer of its shape continues it, whether the previous buffer is still
  // alive or not.
  Slot* chain = nullptr;
  for (Slot& s : slots_) {
    if (!s.chain || s.retired || others(s) || !same_shape(s) || s.taken_in(pass)) continue;
    if (chain == nullptr || s.last_use < chain->last_use) chain = &s;
  }
  if (chain != nullptr) {
    by_buffer_.erase(id_of(*chain));
    const int before = chain->replacements++;
    SlotAssignment a = attach(*chain, storage, t, SlotEvent::kCarried, 0, pass);
    a.replacements = before;
    return a;
  }

  // 2. Take over the least recently used dead slot, same shape first, that
  //    no tensor of this backward pass has used.
  Slot* same = nullptr;
  Slot* other = nullptr;
  for (Slot& s : slots_) {
    if (s.live() || s.retired || others(s) || s.taken_in(pass)) continue;
    Slot*& best = same_shape(s) ? same : other;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  Slot* pick = same ? same : other;
  SlotEvent event = SlotEvent::kNew;
  int64_t dropped = 0;
  int before = 0;
  uint64_t lasting_uses = 0;
  std::string dropped_key, merged_key;
  bool overlapped = false;
  if (pick != nullptr && pick == same && pick->buffer_uses >= kLastingUses) {
    // 2b': a lasting buffer's tensor is gone; this one is another tensor.
    by_buffer_.erase(id_of(*pick));
    lasting_uses = pick->buffer_uses;
    dropped_key = pick->key();
    ++pick->generation;
    event = SlotEvent::kFresh;
    dropped = pick->numel;
    before = pick->replacements;
    pick->replacements = 0;  // starts over: its next takeover is a first one
    pick->overlapped = 0;
    pick->chain = false;
  } else if (pick != nullptr) {
    by_buffer_.erase(id_of(*pick));
    Slot* follower = pick == same ? follower_since_last_use(*pick) : nullptr;
    if (follower != nullptr && follower->taken_in(pass)) follower = nullptr;
    overlapped = follower != nullptr;
    if (overlapped) ++pick->overlapped;
    if (overlapped && ++overlaps_by_shape_[{owner, t.numel(), static_cast<int>(t.scalar_type())}] ==
                          kOverlapsToMerge) {
      // The pattern is confirmed: the follower (the most recent call's slot)
      // becomes the chain and takes this buffer; the slot it alternated with
      // hands over its state and is retired.
      merged_key = pick->key();
      pick->retired = true;
      follower->chain = true;
      by_buffer_.erase(id_of(*follower));
      pick = follower;
      event = SlotEvent::kCarried;
    } else if (pick == same) {
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
      pick->overlapped = 0;  // the slot now serves another tensor
      pick->chain = false;
      dropped = pick->numel;
      dropped_key = pick->key();
    }
    before = pick->replacements++;
  } else {
    slots_.emplace_back();
    pick = &slots_.back();
    pick->id = static_cast<int>(slots_.size()) - 1;
    pick->owner = owner;
  }
  SlotAssignment a = attach(*pick, storage, t, event, dropped, pass);
  a.dropped_key = std::move(dropped_key);
  a.merged_key = std::move(merged_key);
  a.replacements = before;
  a.overlapped = overlapped;
  a.lasting_uses = lasting_uses;
  return a;
}

void BufferSlots::forget_shape_if_unused(const ShapeKey& shape) {
  for (const Slot& o : slots_) {
    if (shape_of(o) == shape) return;
  }
  shape_calls_.erase(shape);
  overlaps_by_shape_.erase(shape);
}

SlotAssignment BufferSlots::attach(Slot& s, const c10::Storage& storage, const at::Tensor& t,
                                   SlotEvent event, int64_t dropped, uint64_t pass) {
  const ShapeKey before = shape_of(s);
  const bool had_shape = s.uses > 0;  // a slot made just now has none yet
  s.storage = storage.getWeakStorageImpl();
  s.offset = t.storage_offset();
  s.numel = t.numel();
  s.dtype = t.scalar_type();
  s.buffer_uses = 0;
  if (had_shape && before != shape_of(s)) forget_shape_if_unused(before);
  note_follows(s);
  by_buffer_[id_of(s)] = static_cast<size_t>(&s - slots_.data());
  return record(s, event, dropped, pass);
}

std::vector<SlotInfo> BufferSlots::slots() const {
  std::vector<SlotInfo> out;
  out.reserve(slots_.size());
  for (const Slot& s : slots_) {
    out.push_back({s.key(), s.numel, std::string(c10::toString(s.dtype)), s.live(),
                   s.replacements, s.uses, s.overlapped, s.chain, s.retired, s.owner});
  }
  return out;
}

}  // namespace compcoll::torch_integration
