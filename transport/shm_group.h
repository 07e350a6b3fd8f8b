// ShmGroup: the ranks of one host moving float32 buffers through one POSIX
// shared-memory segment, the local step of the host hierarchy
// (collectives/hierarchical.h). Works for ranks that are processes and for
// ranks that are threads of one process.
//
// Segment (made by the host's leader, local rank 0):
//   header   per local rank a cache line with its counters (arrive,
//            consumed), its pid and pid namespace, and an abort reason; the
//            leader's counters `taken` and `result`; a `failed` word (0, or
//            the failing local rank + 1)
//   slots    one input slot per non-leader and one result slot R, of
//            chunk_floats floats each
// A call moves its buffer in rounds of at most chunk_floats elements; every
// local rank counts rounds identically, and a counter set to the round number
// says a step of that round is done.
//
// reduce_to_leader, per round: every other rank copies its chunk into its
//   slot and sets `arrive`; the leader waits for all of them and adds the
//   slots into its own buffer in local-rank order, then sets `taken` (a rank
//   waits for it before refilling its slot in the next round of a long call).
//   With LastRound::kReturn the leader does not add the last round: it
//   returns the slots as Addends for its algorithm's encode to add in its
//   own pass (one write and one read of the tensor fewer), and sets `taken`
//   for that round when it shares the result.
//   One synchronisation per round: on hosts with more ranks than cores every
//   wake-up costs a scheduling delay, which a reduce-scatter's second
//   synchronisation would pay again to save the leader some additions.
// broadcast_from_leader, per round: the leader writes its chunk into R
//   (after every rank `consumed` the previous round) and sets `result`; the
//   others read it out and set `consumed`. A mostly-zero chunk (a sparse
//   algorithm's result: at most 1/8 of its words nonzero) goes as (index,
//   bits) pairs and the readers zero their chunk and scatter: a memset and a
//   read-only scan instead of two copies (nonzero_pack.h); anything denser
//   is copied as is. Where the leader's algorithm listed its result's
//   support (dgc, sdagc, sbc and csc: CallInfo::support), the pairs
//   come from that list and the leader does not scan the chunk at all.
// Nothing from one call is still read when the next call writes: a rank
// arrives in call c+1 only after it finished call c.
//
// Waits: spin briefly, then sleep on a futex of the counter; every wait ends
// at the call's deadline (the communicator timeout) with kTransport naming the
// local peer (world rank, local rank, pid) and the step it did not reach,
// unless that peer showed progress since the wait began (its `progress`
// counter, bumped by note_progress at each of its exchanges between hosts):
// then the call's deadline moves to 1.25 timeouts after the wait noticed the
// latest progress (for the call's later waits too), so
// a leader phase of several exchanges, each within the timeout, is waited
// for as the leader itself waits for each of them. A
// peer whose process is gone (SIGKILL included) is named at once, within
// ~50 ms: each wait checks that the awaited peer still runs. A rank that
// fails for any reason sets `failed` and wakes everyone, so its host's ranks
// fail at once with its reason instead of at their timeout; so does a rank
// that destroys its group.
//
// Lifetime: the name (in /dev/shm) exists only while the group is being set
// up: the leader removes it once every local rank has mapped the segment,
// so a crash later leaves nothing behind; the memory goes when the last rank
// unmaps it. A leader killed inside that window (two agreement rounds at
// creation) leaves /dev/shm/compcoll-<nonce>-h<host> behind.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/hierarchical.h"

namespace compcoll {

// Elements per round by default: 4 Mi float32 (16 MiB per slot), so the
// segment of a host of L ranks takes L * 16 MiB of /dev/shm.
inline constexpr size_t kShmDefaultChunkFloats = size_t{1} << 22;

struct ShmGroupOptions {
  std::string name;              // "/compcoll-...": unique per communicator and host
  int local_rank = 0;
  std::vector<int> world_ranks;  // the host's world ranks by local rank (for messages)
  size_t chunk_floats = kShmDefaultChunkFloats;
};

class ShmGroup final : public LocalGroup {
 public:
  // The leader (local rank 0): creates the segment (refusing an existing
  // name) and reserves its memory, so a /dev/shm too small is an error here,
  // not a SIGBUS later. Throws kTransport naming the name and the cause.
  static std::unique_ptr<ShmGroup> create(const ShmGroupOptions& options);
  // The others, after the leader's create: map the segment and check it.
  static std::unique_ptr<ShmGroup> open(const ShmGroupOptions& options);
  ~ShmGroup() override;

  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Leader: removes the segment's name (idempotent; the mappings stay).
  void unlink_name() noexcept;
  const std::string& name() const { return name_; }

  int local_rank() const override { return local_rank_; }
  int local_size() const override { return static_cast<int>(world_ranks_.size()); }
  Addends reduce_to_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                           LastRound last) override;
  void broadcast_from_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                             const std::vector<uint32_t>* support) override;
  void reduce_to_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                        std::chrono::milliseconds timeout) override;
  void gather_from_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                          std::chrono::milliseconds timeout) override;
  void abort(const std::string& why) noexcept override;
  void note_progress() noexcept override;

  struct Header;  // the segment's layout (shm_group.cc)
  struct Slot;

 private:
  using Clock = std::chrono::steady_clock;
  ShmGroup(const ShmGroupOptions& options, int fd, size_t bytes, void* base, bool owner);

  Slot& slot(int l) const;
  float* data(int l) const;  // l == local_size(): the result slot R
  // The sharded calls' input area of local rank l: its slot, R for rank 0.
  float* area(int l) const { return data(l == 0 ? local_size() : l); }
  std::string peer_name(int l) const;
  // Waits until the counter reaches `round`; throws as described above.
  // deadline is the call's: a wait that moves it (the peer's progress)
  // moves it for the call's later waits too.
  void await(const void* counter, uint32_t round, int peer, const char* step,
             Clock::time_point& deadline, std::chrono::milliseconds timeout);
  // Waits for local rank l's input of `round`; on a call's first round
  // also checks that it reduces n elements too (kMismatch naming it).
  void await_arrival(int l, uint32_t round, bool first, size_t n, Clock::time_point& deadline,
                     std::chrono::milliseconds timeout);
  // Why the group failed, for this rank's error ("" while it has not).
  std::string failure() const;
  // Throws a TimeoutError for `timed_out` when it is positive.
  [[noreturn]] void fail(ErrorKind kind, const std::string& what,
                         std::chrono::milliseconds timed_out = {});
  bool peer_gone(int l) const;
  void publish(void* counter, uint32_t round);
  // Throws kTransport when an earlier failure broke the group.
  void check_usable() const;
  // A call of n elements moves in rounds(n) rounds (one even when n == 0,
  // so every rank still meets the others); next_round numbers the k-th.
  struct Round {
    uint32_t number;
    size_t off, len;  // the round's elements: [off, off + len)
  };
  size_t rounds(size_t n) const;
  Round next_round(size_t k, size_t n);
  // A sharded call's slices and this rank's part in it ([lo, hi), empty
  // when it owns no slice), after checking the group and the bounds.
  struct SliceCall {
    int slices = 0;
    bool owner = false;
    size_t lo = 0, hi = 0;
  };
  SliceCall slice_call(const std::vector<size_t>& bounds, size_t n) const;

  std::string name_;
  int local_rank_;
  std::vector<int> world_ranks_;
  size_t chunk_;
  int fd_;
  size_t bytes_;
  void* base_;
  bool owner_;
  bool named_;
  bool aborted_ = false;
  uint32_t round_ = 0;
  // The leader's last round returned as addends (LastRound::kReturn): its
  // `taken` is published when the result is shared.
  std::optional<uint32_t> lent_round_;
  // The sharded calls' last rounds: R holds rank 0's input until every owner
  // took the last reduce round, and a result until every rank read the last
  // gather round.
  uint32_t last_reduce_round_ = 0;
  uint32_t last_gather_round_ = 0;
};

// Collective over `world`: each host with more than one rank gets a segment
// made by its leader, named from a random nonce of world rank 0 (unique per
// communicator); the name is removed once all the host's ranks mapped it.
// Returns this rank's group, or null when it is alone on its host. A rank
// that cannot create or open its segment makes every rank fail (kTransport,
// naming that rank and the cause).
std::unique_ptr<LocalGroup> connect_local_group(Comm& world, const HostLayout& layout,
                                                size_t chunk_floats = kShmDefaultChunkFloats);

}  // namespace compcoll
