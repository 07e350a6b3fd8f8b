// Error-feedback keys for the tensors a torch backend is asked to allreduce.
//
// The Communicator keeps one error-feedback state (residual, momentum) per
// key. A backend only sees flat tensors, so the key has to be derived from
// the tensor. Terms:
//
//   buffer   a tensor's memory identity: its storage object (held through a
//            weak reference, so a freed storage is recognised even when the
//            allocator hands the same address to a new one), byte offset,
//            element count and dtype.
//   slot     one error-feedback state and the buffer it serves. Its key
//            ("t<slot>.<generation>") is what the Communicator is given.
//   dead     a slot whose storage has been freed.
//
// Rules, in order:
//   1. A live buffer keeps its slot (DDP's bucket tensors, persistent
//      gradients, any buffer reused call after call).
//   2. A new buffer takes over a dead slot when there is one, the least
//      recently used first (that is call order, so several same-sized
//      tensors reallocated every step pair up with their own slots):
//      a. same element count and dtype, slot replaced before: the state is
//         carried (a gradient re-allocated every step, e.g. p.grad with
//         zero_grad(set_to_none=True), keeps its residual);
//      b. same element count and dtype, first replacement of the slot: a new
//         generation key, i.e. a fresh state. This is DDP's bucket rebuild
//         after the first iteration: the rebuilt bucket may hold the same
//         parameters in another order, so the old residual cannot be
//         applied to it; it is dropped, and the drop is reported;
//      b'. same element count and dtype, the freed buffer a lasting one (it
//         served kLastingUses calls or more, where a tensor reallocated
//         every step serves one): its tensor is gone, and the new buffer is
//         another tensor, e.g. the first bucket of a new DDP model built
//         after the previous one was freed (cross-validation folds, a
//         second fit, a sweep in one process). A fresh state, and the slot
//         starts over as if new (its next takeover is a first replacement,
//         so the new model's rebuild is b). Carried, the old model's
//         residual would land on the new model's parameters;
//      c. another size or dtype (only when no dead slot of the same shape
//         exists): the slot's key is reused and its state dropped (the
//         backend frees it before the call, so the Communicator makes a
//         fresh one: a residual never moves to another dtype, even at the
//         same element count); reported as a drop.
//   3. Otherwise a new slot.
//
// Within one backward pass (issue_scope.h) a slot used in that pass belongs
// to a tensor of the pass: rules 2 and the chains below never give it to
// another buffer of the same pass, alive or not. Without that, tensors
// freed right after their allreduce would all meet one dead slot: compiled
// autograd's python reducer (torch.compile with optimize_ddp=
// "python_reducer") allreduces a temporary per parameter and frees it
// before the next, and every parameter of one shape would share one
// residual, each size taking over the others' slots in turn (2c) and
// dropping them. Told apart by the pass, the k-th tensor of a shape in a
// pass gets the slot of the k-th of the previous pass (least recently used
// = call order): fresh once (2b), then carried.
//
// Owners (issue_scope.h: current_owner): where compcoll knows which model a
// call is for (a DDP comm hook's), every rule above and below picks only
// among slots of the call's owner, so no two models ever share a state
// unless they reduce the same live buffer (rule 1). Slot ids stay unique
// across owners, so keys do not name the owner.
//
// Overlapping reallocation: a program that reduces a new tensor every call
// while the previous one is still alive (a DDP comm hook that allreduces a
// fresh tensor and returns it: DDP holds the returned tensor until the next
// step; a functional collective whose result is kept) would get two slots
// that alternate, each with half the calls, its own warm-up count and its
// own part of the residual. When the second buffer arrives, rule 3 cannot
// tell that from a second tensor of the same shape, so the pattern is
// recognised afterwards: a slot S taken over by rule 2 whose buffer was
// never reduced again after another live slot L got a new buffer, when S's
// call was the last of that shape before it (L "follows" S) and L's was the
// only call of that shape since, is an overlapped takeover (with m tensors
// of one shape each reallocated so, m calls come between, and they are left
// to alternate: a merge there would mix different tensors' states). At the kOverlapsToMerge-th of one shape (a pattern,
// not a coincidence such as one model built before the previous was freed)
// the new buffer takes L instead, S's state is merged into L's
// (merge_codec_state: residuals and velocities add, nothing is lost) and S
// is retired; L becomes a chain, and from then on every new buffer of that
// shape continues the least recently used chain slot of its shape, alive or
// not, before rules 2 and 3 are tried.
//
// Limits: a residual never moves between buffers of different shapes, so at
// DDP's bucket rebuild one step's residual is dropped (reported at INFO); a
// program that reduces the same live buffer for different purposes shares one
// state between them (as with address keys); tensors that are reallocated
// every step lose their first step's residual (rule 2b).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace compcoll::torch_integration {

enum class SlotEvent { kSame, kNew, kCarried, kFresh, kResized };
const char* slot_event_name(SlotEvent e);

struct SlotAssignment {
  std::string key;
  SlotEvent event;
  int64_t dropped_elems = 0;  // residual elements dropped (kFresh, kResized)
  std::string dropped_key;    // kFresh, kResized: the key whose state is to be freed
  int replacements = 0;       // how often the slot was taken over before this time
  uint64_t lasting_uses = 0;  // b': the calls the freed lasting buffer served (else 0)
  bool overlapped = false;    // rule 2 took over a slot another live slot follows (above)
  std::string merged_key;     // the key whose state is to be merged into this one first
};

struct SlotInfo {
  std::string key;
  int64_t numel;
  std::string dtype;
  bool live;
  int replacements;
  uint64_t uses;
  int overlapped;  // takeovers of this slot that were overlapped ones (above)
  bool chain;      // continues a reallocated tensor (above)
  bool retired;    // its state was merged into a chain; never taken over again
  uint64_t owner;  // the owner it serves (above), 0 for unknown
};

class BufferSlots {
 public:
  // The slot for t (a dense tensor), by the rules above; `pass` is the
  // backward pass issuing it (issue_scope.h: backward_pass()), 0 for none,
  // and `owner` the model it is for (current_owner()), 0 for unknown.
  SlotAssignment assign(const at::Tensor& t, uint64_t pass = 0, uint64_t owner = 0);

  std::vector<SlotInfo> slots() const;
  // Overlapped takeovers of one shape that confirm the pattern (above).
  static constexpr int kOverlapsToMerge = 3;
  // Rule 2b': a freed buffer that served this many calls was a lasting one.
  static constexpr uint64_t kLastingUses = 2;
  // The last `kTraceLength` assignments, oldest first: (key, numel, event).
  struct TraceEntry {
    std::string key;
    int64_t numel;
    SlotEvent event;
  };
  const std::deque<TraceEntry>& trace() const { return trace_; }
  static constexpr size_t kTraceLength = 4096;
  // Shapes (owner, numel, dtype) with per-shape counts kept: at most one per
  // slot, so a program whose tensor sizes keep changing does not grow them.
  size_t shapes_tracked() const { return shape_calls_.size(); }

 private:
  struct Slot {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    int64_t offset = 0;
    int64_t numel = 0;
    c10::ScalarType dtype = at::kFloat;
    int id = 0;
    int generation = 0;
    int replacements = 0;
    uint64_t last_use = 0;
    uint64_t last_pass = 0;  // the backward pass of its last use, 0 for none
    uint64_t owner = 0;      // the owner it was made for (above)
    uint64_t uses = 0;
    uint64_t buffer_uses = 0;  // calls with its current buffer
    // The slot whose call of this shape came last before this slot got its
    // current buffer, when that slot's buffer was still alive then (-1:
    // none), and that slot's last_use at the time.
    int follows = -1;
    uint64_t follows_use = 0;
    int overlapped = 0;
    uint64_t shape_call = 0;  // calls of its shape so far, at its last use
    bool chain = false;
    bool retired = false;

    bool live() const { return !storage.expired(); }
    // Used in backward pass `pass` (not 0) already: another tensor's.
    bool taken_in(uint64_t pass) const { return pass != 0 && last_pass == pass; }
    std::string key() const;
  };
  struct BufferId {
    const c10::StorageImpl* storage;
    int64_t offset;
    int64_t numel;
    int dtype;
    bool operator==(const BufferId&) const = default;
  };
  struct BufferIdHash {
    size_t operator()(const BufferId& b) const;
  };
  static BufferId id_of(const Slot& s);

  SlotAssignment record(Slot& s, SlotEvent e, int64_t dropped, uint64_t pass);
  // Sets s.follows for the buffer s is getting now (before it is recorded).
  void note_follows(Slot& s);
  // The live slot that follows `taken`, when `taken` was not used since;
  // null if none.
  Slot* follower_since_last_use(const Slot& taken);
  // Drops the per-shape counts of `shape` once no slot has it (a slot
  // resized away from it, rule 2c).
  void forget_shape_if_unused(const std::tuple<uint64_t, int64_t, int>& shape);
  // Gives s the buffer of t and records the call.
  SlotAssignment attach(Slot& s, const c10::Storage& storage, const at::Tensor& t,
                        SlotEvent event, int64_t dropped, uint64_t pass);

  std::vector<Slot> slots_;
  std::unordered_map<BufferId, size_t, BufferIdHash> by_buffer_;
  uint64_t clock_ = 0;
  // Per owner and shape (numel, dtype): overlapped takeovers, and calls.
  using ShapeKey = std::tuple<uint64_t, int64_t, int>;
  static ShapeKey shape_of(const Slot& s) { return {s.owner, s.numel, static_cast<int>(s.dtype)}; }
  std::map<ShapeKey, int> overlaps_by_shape_;
  std::map<ShapeKey, uint64_t> shape_calls_;
  std::deque<TraceEntry> trace_;
};

}  // namespace compcoll::torch_integration
