// Per-communicator error-feedback memory (residuals, momenta), one entry per
// tensor. The key is the caller's explicit key when given, else (buffer
// address, element count, dtype), which is what DDP buckets and NCCL callers
// provide. Entries unused for `evict_after` calls of this communicator that
// use the store (calls on the dense route, an evaluation loop's metrics, do
// not age them) are dropped, so a model whose buffers move cannot grow
// memory without bound; what a dropped entry had not sent yet is lost, and
// tick() says how much, for the communicator to warn.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compcoll/types.h"
#include "compression/codec.h"

namespace compcoll {

struct StateKey {
  std::string explicit_key;  // wins when non-empty
  uintptr_t address = 0;
  size_t count = 0;
  DType dtype = DType::kFloat32;

  std::string str() const;
};

class StateStore {
 public:
  explicit StateStore(uint64_t evict_after) : evict_after_(evict_after) {}

  // The entry for key, created by make() when absent or when the existing
  // entry has another element count; `got` says what happened.
  // A restored entry (put()) that no call has used yet is not replaced by a
  // call of another size but kept aside, and comes back at the key's first
  // call of its own size: DDP's first iteration after a restart reduces its
  // initial bucket under the key its rebuilt bucket had, at another size,
  // and the rebuilt bucket of the second iteration gets its state back.
  enum class Got {
    kExisting,      // the key's entry, at this size
    kNew,           // made: the key had no entry
    kReplaced,      // made: the key's entry had another size and is dropped
    kKeptAside,     // made: the key's restored, unused entry had another size, kept aside
    kBackFromAside  // the restored entry kept aside earlier: this is its size
  };
  CodecState& get(const StateKey& key, size_t count,
                  const std::function<std::unique_ptr<CodecState>()>& make, Got* got);

  // What tick() dropped.
  struct Evicted {
    size_t entries = 0;
    // Of those, the ones holding error feedback not sent yet (a nonzero
    // residual or momentum; a device-resident one is counted unread), the
    // L1 norm of their host residuals and their first key texts.
    size_t holding = 0;
    double residual_l1 = 0.0;
    std::vector<std::string> keys;  // up to kKeysNamed
  };
  static constexpr size_t kKeysNamed = 3;
  // Ends a call: when the call used the store (get()), advances the call
  // clock and drops the entries unused for evict_after such calls.
  Evicted tick();

  // The momentum hand-over's mirror kept by call order instead of by the
  // tensor's key (Communicator::set_handover_order_key): an entry of its
  // own, "order:<order_key>", holding only `handed` (n floats, zero when new
  // or of another size). Used, aged, evicted, rescaled and checkpointed as
  // every entry is. A new one (or one of another size) takes `seed`'s
  // contents when seed holds n floats (the tensor's own mirror: from a
  // checkpoint written before mirrors were kept by order, or the slot's
  // until now), else starts at zero.
  std::vector<float>& order_mirror(const std::string& order_key, size_t n,
                                   std::vector<float>& seed);

  // Drops one entry now (its owner knows it is gone); false if absent.
  bool erase(const StateKey& key) { return entries_.erase(key.str()) > 0; }

  // Merges the entry of `from` into the entry of `into` (merge_codec_state)
  // and erases `from`; with no entry for `into`, from's entry is moved there.
  // Returns what happened, for the log.
  enum class Merge { kNoSource, kMoved, kMerged, kSizeMismatch };
  Merge merge(const StateKey& from, const StateKey& into);

  // The entry of key, or null; never creates one.
  const CodecState* find(const StateKey& key) const;

  // Checkpoints (plugin/state_file.h): every entry with its key text and the
  // calls since its last use, sorted by key; and the way back in. A key
  // whose restored entry is kept aside saves that entry, not the one made
  // by the call of another size: a run that ends before the size comes back
  // (DDP stopped after its first iteration, whose initial bucket took the
  // key) passes the checkpointed state on instead of losing it.
  struct Saved {
    const std::string* key;
    const CodecState* state;
    uint64_t idle;
  };
  // (Call bring_to_host() first: a device-resident entry's host vectors are stale.)
  std::vector<Saved> saved() const;
  // Brings every device-resident entry back to host memory (CodecState::bring_to_host).
  void bring_to_host();
  // Rescales every entry (compression/state_scale.h): the unit of the
  // gradients changed, as when a loss scale does. Returns how many.
  size_t rescale(float factor);
  uint64_t clock() const { return now_; }
  // Replaces the store's clock (ages of restored entries count from it).
  void set_clock(uint64_t now) { now_ = now; }
  // Inserts (or replaces) the entry of a key text, `idle` calls old, as
  // restored from a checkpoint: unclaimed until a get() of the same size
  // when the checkpointed run had used it within kRecentlyUsedCalls (a
  // training step's tensors); an entry idle longer there counts as used.
  static constexpr uint64_t kRecentlyUsedCalls = 1000;
  void put(const std::string& key_text, std::unique_ptr<CodecState> state, uint64_t idle);
  // A resume that did not fully happen, for the communicator to say: the
  // entry of key was restored and no call has used it yet.
  bool restored_unclaimed(const StateKey& key) const;
  // Restored entries dropped before any call used them (evicted by tick(),
  // kept aside included), since creation.
  size_t restored_dropped() const { return restored_dropped_; }

  size_t entries() const { return entries_.size(); }
  size_t memory_bytes() const;
  void clear() {
    entries_.clear();
    aside_.clear();
  }

 private:
  struct Entry {
    std::unique_ptr<CodecState> state;
    uint64_t last_used;
    bool restored_unclaimed = false;  // put() by a checkpoint, not yet used
  };
  uint64_t evict_after_;
  uint64_t now_ = 0;
  bool used_since_tick_ = false;  // a get() since the last tick()
  size_t restored_dropped_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  // Restored entries kept aside by a call of another size (see get); aged
  // and evicted as entries are, saved in their key's place.
  std::unordered_map<std::string, Entry> aside_;
};

}  // namespace compcoll
