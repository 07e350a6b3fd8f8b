#include "transport/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>

#include "collectives/agreement.h"
#include "compcoll/error.h"
#include "transport/nonzero_pack.h"
#include "transport/stream_copy.h"

namespace compcoll {

using Counter = std::atomic<uint32_t>;
static_assert(Counter::is_always_lock_free && sizeof(Counter) == sizeof(uint32_t),
              "futex words must be plain lock-free 32-bit atomics");

namespace {

constexpr uint64_t kMagic = 0x636f6d70636f6c6cull;  // "compcoll"
constexpr uint32_t kVersion = 5;
constexpr int kSpins = 256;
// How often a sleeping wait looks at whether the awaited peer still runs.
constexpr auto kLivenessEvery = std::chrono::milliseconds(50);
constexpr size_t kReasonBytes = 480;
// The broadcast sends a round as (index, bits) pairs when at most 1/8 of its
// words are nonzero: then the pairs take at most half the bytes of a dense
// round and the receivers' memset + scatter beats a copy (nonzero_pack.h).
constexpr size_t kSparseResultDivisor = 8;
// result_pairs of a round sent densely.
constexpr uint64_t kDenseResult = ~uint64_t{0};

uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void futex_wait(const Counter* word, uint32_t seen, std::chrono::nanoseconds left) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(left.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(left.count() % 1000000000);
  // Not FUTEX_PRIVATE: the word is shared between processes. EAGAIN (the
  // value already moved), EINTR and ETIMEDOUT all mean "look again".
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(Counter* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

struct alignas(64) ShmGroup::Slot {
  Counter arrive{0};
  Counter consumed{0};
  Counter taken{0};   // sharded: this owner has read every input of the round
  Counter shared{0};  // sharded: this owner's slice of the round is in R
  Counter progress{0};  // bumped at each of this rank's exchanges between hosts
  std::atomic<uint64_t> count{0};  // the call's element count, checked across ranks
  int32_t pid = 0;
  uint64_t pidns = 0;
  char reason[kReasonBytes] = {};  // written once, before `failed` names this rank
};

struct alignas(64) ShmGroup::Header {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t local_size = 0;
  uint64_t chunk_floats = 0;
  alignas(64) Counter result{0};
  std::atomic<uint64_t> result_pairs{0};  // this round's R: pairs, or kDenseResult
  alignas(64) Counter taken{0};  // the leader has added every slot of this round
  alignas(64) Counter failed{0};  // 0, or the local rank + 1 that failed first
};

namespace {

size_t header_bytes(size_t local_size) {
  return align_up(sizeof(ShmGroup::Header) + local_size * sizeof(ShmGroup::Slot), 4096);
}

// Slots for local ranks 1..L-1 (the leader adds into its own buffer) and R.
size_t segment_bytes(size_t local_size, size_t chunk) {
  return header_bytes(local_size) + local_size * chunk * sizeof(float);
}

}  // namespace

ShmGroup::ShmGroup(const ShmGroupOptions& o, int fd, size_t bytes, void* base, bool owner)
    : name_(o.name),
      local_rank_(o.local_rank),
      world_ranks_(o.world_ranks),
      chunk_(o.chunk_floats),
      fd_(fd),
      bytes_(bytes),
      base_(base),
      owner_(owner),
      named_(owner) {}

ShmGroup::Slot& ShmGroup::slot(int l) const {
  auto* first = reinterpret_cast<Slot*>(static_cast<uint8_t*>(base_) + sizeof(Header));
  return first[l];
}

float* ShmGroup::data(int l) const {
  auto* d = static_cast<uint8_t*>(base_) + header_bytes(world_ranks_.size());
  return reinterpret_cast<float*>(d) + static_cast<size_t>(l - 1) * chunk_;
}

namespace {

void check_options(const ShmGroupOptions& o) {
  CC_CHECK(o.name.size() > 1 && o.name[0] == '/' && o.name.find('/', 1) == std::string::npos,
           kInvalidArgument, "shared-memory name '", o.name, "' must be '/' and a file name");
  CC_CHECK(o.world_ranks.size() >= 2 && o.local_rank >= 0 &&
               o.local_rank < static_cast<int>(o.world_ranks.size()),
           kInvalidArgument, "local rank ", o.local_rank, " of a ", o.world_ranks.size(),
           "-rank host group");
  CC_CHECK(o.chunk_floats >= 1 && o.chunk_floats <= UINT32_MAX, kInvalidArgument,
           "the shared-memory chunk must hold 1 to 2^32 - 1 elements (the sparse share-back "
           "indexes a round with 32 bits), not ", o.chunk_floats);
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    CC_THROW(kTransport, "cannot map the shared-memory segment ", name, " (", bytes,
             " bytes): ", std::strerror(err));
  }
  return base;
}

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::create(const ShmGroupOptions& o) {
  check_options(o);
  CC_CHECK_EQ(o.local_rank, 0, kInvalidArgument, "only a host's leader creates its segment");
  const size_t L = o.world_ranks.size();
  const size_t bytes = segment_bytes(L, o.chunk_floats);
  const int fd = shm_open(o.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  CC_CHECK(fd >= 0, kTransport, "cannot create the shared-memory segment ", o.name,
           " for the host hierarchy: ", std::strerror(errno));
  // Reserve the memory now: tmpfs would otherwise hand out pages lazily and
  // kill us with SIGBUS mid-call when /dev/shm is full.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(o.name.c_str());
    CC_THROW(kTransport, "cannot reserve ", bytes >> 20, " MiB of shared memory (", o.name,
             ") for the host hierarchy of ", L, " local ranks: ", std::strerror(err),
             "; enlarge /dev/shm (containers: --shm-size) or set COMPCOLL_HIERARCHY=off");
  }
  void* base = nullptr;
  try {
    base = map(fd, bytes, o.name);
  } catch (...) {
    shm_unlink(o.name.c_str());
    throw;
  }
  std::unique_ptr<ShmGroup> g(new ShmGroup(o, fd, bytes, base, true));
  auto* h = new (base) Header();
  for (size_t l = 0; l < L; ++l) new (&g->slot(static_cast<int>(l))) Slot();
  h->version = kVersion;
  h->local_size = static_cast<uint32_t>(L);
  h->chunk_floats = o.chunk_floats;
  g->slot(0).pid = static_cast<int32_t>(getpid());
  g->slot(0).pidns = pid_namespace();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return g;
}

std::unique_ptr<ShmGroup> ShmGroup::open(const ShmGroupOptions& o) {
  check_options(o);
  const int fd = shm_open(o.name.c_str(), O_RDWR, 0);
  CC_CHECK(fd >= 0, kTransport, "cannot open the shared-memory segment ", o.name,
           " that the host's leader (world rank ", o.world_ranks[0], ") created: ",
           std::strerror(errno),
           ". Ranks with the same host id must share /dev/shm; check COMPCOLL_HOST_ID "
           "or set COMPCOLL_HIERARCHY=off");
  struct stat st {};
  const size_t expected = segment_bytes(o.world_ranks.size(), o.chunk_floats);
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != expected) {
    close(fd);
    CC_THROW(kTransport, "the shared-memory segment ", o.name, " has ",
             static_cast<long long>(st.st_size), " bytes, not the ", expected,
             " this rank expects (another program's segment, or ranks built differently)");
  }
  void* base = map(fd, expected, o.name);
  std::unique_ptr<ShmGroup> g(new ShmGroup(o, fd, expected, base, false));
  const auto* h = static_cast<const Header*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  CC_CHECK(h->magic == kMagic && h->version == kVersion && h->local_size == o.world_ranks.size() &&
               h->chunk_floats == o.chunk_floats,
           kTransport, "the shared-memory segment ", o.name,
           " does not have the layout this rank expects (local size ", h->local_size, " vs ",
           o.world_ranks.size(), ", chunk ", h->chunk_floats, " vs ", o.chunk_floats, ")");
  Slot& mine = g->slot(o.local_rank);
  mine.pid = static_cast<int32_t>(getpid());
  mine.pidns = pid_namespace();
  return g;
}

ShmGroup::~ShmGroup() {
  // Peers still waiting on this rank (only after a failure elsewhere) fail
  // now instead of at their timeout.
  abort("left the communicator");
  unlink_name();
  munmap(base_, bytes_);
  close(fd_);
}

void ShmGroup::unlink_name() noexcept {
  if (owner_ && named_) shm_unlink(name_.c_str());
  named_ = false;
}

std::string ShmGroup::peer_name(int l) const {
  return detail::concat("world rank ", world_ranks_[static_cast<size_t>(l)], " (local rank ", l,
                        ", pid ", slot(l).pid, ")");
}

void ShmGroup::abort(const std::string& why) noexcept {
  if (aborted_) return;
  aborted_ = true;
  auto* h = static_cast<Header*>(base_);
  Slot& mine = slot(local_rank_);
  const size_t n = std::min(why.size(), kReasonBytes - 1);
  std::memcpy(mine.reason, why.data(), n);
  mine.reason[n] = '\0';
  uint32_t none = 0;
  h->failed.compare_exchange_strong(none, static_cast<uint32_t>(local_rank_ + 1),
                                    std::memory_order_acq_rel);
  futex_wake(&h->result);
  futex_wake(&h->taken);
  for (int l = 0; l < local_size(); ++l) {
    futex_wake(&slot(l).arrive);
    futex_wake(&slot(l).consumed);
  }
}

std::string ShmGroup::failure() const {
  const auto* h = static_cast<const Header*>(base_);
  const uint32_t f = h->failed.load(std::memory_order_acquire);
  if (f == 0) return {};
  const int l = static_cast<int>(f) - 1;
  if (l == local_rank_) {
    return "this host's shared-memory group failed earlier; the communicator must be rebuilt";
  }
  // The reason is often an Error's message: quoted without its "compcoll: ".
  std::string reason(slot(l).reason);
  if (reason.rfind("compcoll: ", 0) == 0) reason.erase(0, 10);
  return detail::concat("local peer ", peer_name(l), " failed: ", reason);
}

void ShmGroup::fail(ErrorKind kind, const std::string& what, std::chrono::milliseconds timed_out) {
  // `what` may be an Error's message: its "compcoll: " goes in front, once.
  const std::string msg =
      detail::concat("world rank ", world_ranks_[size_t(local_rank_)], " (host hierarchy): ",
                     what.rfind("compcoll: ", 0) == 0 ? what.substr(10) : what);
  abort(msg);  // the peers' errors quote it after their own prefix
  const std::string thrown = "compcoll: " + msg;  // as every Error's message starts
  if (timed_out.count() > 0) throw TimeoutError(thrown, timed_out);
  throw Error(kind, thrown);
}

bool ShmGroup::peer_gone(int l) const {
  const Slot& s = slot(l);
  if (s.pid <= 0 || s.pid == getpid() || s.pidns != pid_namespace()) return false;
  if (kill(s.pid, 0) != 0) return errno == ESRCH;
  // Killed but not yet reaped by its parent: a zombie no longer runs.
  std::ifstream stat("/proc/" + std::to_string(s.pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() &&
         (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

void ShmGroup::await(const void* counter, uint32_t round, int peer, const char* step,
                     Clock::time_point& deadline, std::chrono::milliseconds timeout) {
  const auto* word = static_cast<const Counter*>(counter);
  auto next_check = Clock::time_point::min();
  // The peer's exchanges between hosts (note_progress) move the deadline.
  uint32_t progress = slot(peer).progress.load(std::memory_order_relaxed);
  bool extended = false;
  for (int i = 0;; ++i) {
    const uint32_t v = word->load(std::memory_order_acquire);
    if (static_cast<int32_t>(v - round) >= 0) return;  // wrap-safe "v >= round"
    const auto* h = static_cast<const Header*>(base_);
    if (h->failed.load(std::memory_order_acquire) != 0) {
      // A peer that failed or left after publishing this round is no reason
      // to fail: look at the counter again, now ordered after the flag.
      if (static_cast<int32_t>(word->load(std::memory_order_acquire) - round) >= 0) return;
      fail(ErrorKind::kTransport, failure());
    }
    if (i < kSpins) {
      cpu_relax();
      continue;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      const uint32_t seen = slot(peer).progress.load(std::memory_order_relaxed);
      if (seen != progress) {
        // A quarter more than the timeout: the peer's own exchange, bounded
        // by the timeout from its start (at or before `seen`), fails first
        // and names its cause, which this wait then quotes.
        progress = seen;
        extended = true;
        deadline = now + timeout + timeout / 4;
        continue;
      }
      fail(ErrorKind::kTransport,
           detail::concat("local peer ", peer_name(peer), " did not ", step, " within the ",
                          timeout.count(), " ms timeout",
                          extended ? " after its last exchange between hosts" : ""),
           timeout);
    }
    if (now >= next_check) {
      next_check = now + kLivenessEvery;
      if (peer_gone(peer)) {
        fail(ErrorKind::kTransport, detail::concat("local peer ", peer_name(peer),
                                                   " died (its process is gone) before it could ",
                                                   step));
      }
    }
    futex_wait(word, v, std::min<Clock::duration>(deadline - now, kLivenessEvery));
  }
}

void ShmGroup::note_progress() noexcept {
  slot(local_rank_).progress.fetch_add(1, std::memory_order_relaxed);
}

void ShmGroup::publish(void* counter, uint32_t round) {
  auto* word = static_cast<Counter*>(counter);
  word->store(round, std::memory_order_release);
  futex_wake(word);
}

void ShmGroup::check_usable() const {
  CC_CHECK(!aborted_, kTransport, "world rank ", world_ranks_[size_t(local_rank_)],
           ": this host's shared-memory group failed earlier; the communicator must be rebuilt");
}

size_t ShmGroup::rounds(size_t n) const { return std::max<size_t>(1, (n + chunk_ - 1) / chunk_); }

ShmGroup::Round ShmGroup::next_round(size_t k, size_t n) {
  const size_t off = k * chunk_;
  return {++round_, off, std::min(chunk_, n - std::min(n, off))};
}

void ShmGroup::await_arrival(int l, uint32_t round, bool first, size_t n,
                             Clock::time_point& deadline, std::chrono::milliseconds timeout) {
  await(&slot(l).arrive, round, l, "arrive at the local reduce", deadline, timeout);
  const uint64_t theirs = slot(l).count.load(std::memory_order_relaxed);
  if (first && theirs != n) {
    fail(ErrorKind::kMismatch, detail::concat("local peer ", peer_name(l), " reduces ", theirs,
                                              " elements, this rank ", n,
                                              " (every rank must pass the same count)"));
  }
}

Addends ShmGroup::reduce_to_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                                   LastRound last) {
  check_usable();
  // Moved on by await() while a peer shows progress, for every later wait
  // of the call too (a later round, another slice owner).
  auto deadline = Clock::now() + timeout;
  const int L = local_size();
  auto* h = static_cast<Header*>(base_);
  for (size_t k = 0; k < rounds(n); ++k) {
    const auto [round, off, len] = next_round(k, n);
    if (local_rank_ > 0) {
      Slot& me = slot(local_rank_);
      // The slot still holds the previous round until the leader took it.
      if (k > 0) await(&h->taken, round - 1, 0, "take the previous round", deadline, timeout);
      me.count.store(n, std::memory_order_relaxed);
      stream_copy(data(local_rank_), buf + off, len * sizeof(float));
      publish(&me.arrive, round);
      continue;
    }
    for (int l = 1; l < L; ++l) await_arrival(l, round, k == 0, n, deadline, timeout);
    // In local-rank order: ((leader + 1) + 2) + ...
    Addends parts;
    parts.off = off;
    parts.len = len;
    for (int l = 1; l < L; ++l) parts.parts.push_back(data(l));
    if (last == LastRound::kReturn && k + 1 == rounds(n)) {
      // The slots are read until broadcast_from_leader, which says `taken`.
      lent_round_ = round;
      return parts;
    }
    add_addends(buf, parts);
    publish(&h->taken, round);
  }
  return {};
}

void ShmGroup::broadcast_from_leader(float* buf, size_t n, std::chrono::milliseconds timeout,
                                     const std::vector<uint32_t>* support) {
  check_usable();
  // Moved on by await() while a peer shows progress, for every later wait
  // of the call too (a later round, another slice owner).
  auto deadline = Clock::now() + timeout;
  const int L = local_size();
  auto* h = static_cast<Header*>(base_);
  if (lent_round_) {
    // reduce_to_leader's returned addends have been used: the leader's
    // algorithm is done with the slots.
    publish(&h->taken, *lent_round_);
    lent_round_.reset();
  }
  for (size_t k = 0; k < rounds(n); ++k) {
    const auto [round, off, len] = next_round(k, n);
    float* r = data(L);
    if (local_rank_ == 0) {
      if (k > 0) {
        for (int l = 1; l < L; ++l) {
          await(&slot(l).consumed, round - 1, l, "read the shared result", deadline, timeout);
        }
      }
      uint64_t pairs = kDenseResult;
      if (len) {
        const size_t cap = len / kSparseResultDivisor;
        auto* pairs_out = reinterpret_cast<uint32_t*>(r);
        size_t packed = kNotSparse;
        if (cap && support) {
          packed = pack_listed(buf, off, len, *support, pairs_out, cap);
        } else if (cap) {
          packed = pack_nonzeros(buf + off, len, pairs_out, cap);
        }
        if (packed == kNotSparse) {
          stream_copy(r, buf + off, len * sizeof(float));
        } else {
          pairs = packed;
        }
      }
      // Ordered before the readers see the round by publish()'s release.
      h->result_pairs.store(pairs, std::memory_order_relaxed);
      publish(&h->result, round);
    } else {
      await(&h->result, round, 0, "share the result", deadline, timeout);
      const uint64_t pairs = h->result_pairs.load(std::memory_order_relaxed);
      if (pairs == kDenseResult) {
        stream_copy(buf + off, r, len * sizeof(float));
      } else {
        CC_CHECK_LE(pairs, len / kSparseResultDivisor, kInternal, "world rank ",
                    world_ranks_[size_t(local_rank_)], ": the host's shared result announces ",
                    pairs, " pairs for a ", len, "-element round (corrupted shared memory)");
        unpack_nonzeros(reinterpret_cast<const uint32_t*>(r), static_cast<size_t>(pairs),
                        buf + off, len);
      }
      publish(&slot(local_rank_).consumed, round);
    }
  }
}

namespace {

void check_bounds(const std::vector<size_t>& bounds, size_t n, int local_size) {
  CC_CHECK(bounds.size() >= 2 && bounds.size() - 1 <= static_cast<size_t>(local_size) &&
               bounds.front() == 0 && bounds.back() == n &&
               std::is_sorted(bounds.begin(), bounds.end()),
           kInternal, "slice bounds for ", n, " elements over ", local_size,
           " local ranks are not ascending from 0 to n");
}

}  // namespace

ShmGroup::SliceCall ShmGroup::slice_call(const std::vector<size_t>& bounds, size_t n) const {
  check_usable();
  check_bounds(bounds, n, local_size());
  SliceCall c;
  c.slices = static_cast<int>(bounds.size()) - 1;
  c.owner = local_rank_ < c.slices;
  if (c.owner) {
    c.lo = bounds[static_cast<size_t>(local_rank_)];
    c.hi = bounds[static_cast<size_t>(local_rank_) + 1];
  }
  return c;
}

void ShmGroup::reduce_to_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                                std::chrono::milliseconds timeout) {
  const SliceCall c = slice_call(bounds, n);
  // Moved on by await() while a peer shows progress, for every later wait
  // of the call too (a later round, another slice owner).
  auto deadline = Clock::now() + timeout;
  const int L = local_size(), S = c.slices, me = local_rank_;
  for (size_t k = 0; k < rounds(n); ++k) {
    const auto [round, off, len] = next_round(k, n);
    if (k > 0) {
      // Every owner must have read this rank's previous round.
      for (int o = 0; o < S; ++o) {
        await(&slot(o).taken, round - 1, o, "take the previous round", deadline, timeout);
      }
    } else if (me == 0) {
      // Rank 0's input goes to R, which held the last result until every rank read it.
      for (int l = 1; l < L; ++l) {
        await(&slot(l).consumed, last_gather_round_, l, "read the shared result", deadline, timeout);
      }
    }
    slot(me).count.store(n, std::memory_order_relaxed);
    stream_copy(area(me), buf + off, len * sizeof(float));
    publish(&slot(me).arrive, round);
    if (!c.owner) continue;
    for (int l = 0; l < L; ++l) {
      if (l != me) await_arrival(l, round, k == 0, n, deadline, timeout);
    }
    // This owner's slice of the round, added in local-rank order.
    const size_t a = std::max(off, c.lo), b = std::min(off + len, c.hi);
    if (a < b) {
      float* out = buf + a;
      const size_t m = b - a;
      std::memcpy(out, area(0) + (a - off), m * sizeof(float));
      for (int l = 1; l < L; ++l) {
        const float* in = area(l) + (a - off);
        for (size_t i = 0; i < m; ++i) out[i] += in[i];
      }
    }
    publish(&slot(me).taken, round);
  }
  last_reduce_round_ = round_;
}

void ShmGroup::gather_from_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                                  std::chrono::milliseconds timeout) {
  const SliceCall c = slice_call(bounds, n);
  // Moved on by await() while a peer shows progress, for every later wait
  // of the call too (a later round, another slice owner).
  auto deadline = Clock::now() + timeout;
  const int L = local_size(), S = c.slices, me = local_rank_;
  float* r = data(L);
  for (size_t k = 0; k < rounds(n); ++k) {
    const auto [round, off, len] = next_round(k, n);
    // This rank's own slice within the round, [a, b) (empty for a non-owner).
    const size_t a = std::min(std::max(off, c.lo), off + len);
    const size_t b = std::max(a, std::min(off + len, c.hi));
    if (c.owner) {
      if (k == 0) {
        // R held rank 0's input until every owner took the last reduce round.
        for (int o = 0; o < S; ++o) {
          await(&slot(o).taken, last_reduce_round_, o, "finish the local reduce", deadline, timeout);
        }
      } else {
        for (int l = 0; l < L; ++l) {
          if (l != me) await(&slot(l).consumed, round - 1, l, "read the shared result", deadline, timeout);
        }
      }
      if (a < b) stream_copy(r + (a - off), buf + a, (b - a) * sizeof(float));
      publish(&slot(me).shared, round);
    }
    for (int o = 0; o < S; ++o) {
      if (o != me) await(&slot(o).shared, round, o, "share its slice of the result", deadline, timeout);
    }
    // Everything but this rank's own slice, whose bits are already here.
    if (a > off) stream_copy(buf + off, r, (a - off) * sizeof(float));
    if (off + len > b) stream_copy(buf + b, r + (b - off), (off + len - b) * sizeof(float));
    publish(&slot(me).consumed, round);
  }
  last_gather_round_ = round_;
}

constexpr const char* kSetupStep =
    "the host hierarchy's shared memory could not be set up (set COMPCOLL_HIERARCHY=off to run "
    "without it)";

std::unique_ptr<LocalGroup> connect_local_group(Comm& world, const HostLayout& layout,
                                                size_t chunk_floats) {
  const uint64_t nonce = shared_nonce(world);
  const int me = world.rank();
  const int host = layout.host_of[static_cast<size_t>(me)];
  ShmGroupOptions o;
  char name[64];
  std::snprintf(name, sizeof name, "/compcoll-%016llx-h%d", static_cast<unsigned long long>(nonce), host);
  o.name = name;
  o.local_rank = layout.local_rank(me);
  o.world_ranks = layout.members[static_cast<size_t>(host)];
  o.chunk_floats = chunk_floats;
  const bool grouped = o.world_ranks.size() > 1;

  std::unique_ptr<ShmGroup> group;
  std::string error;
  if (grouped && o.local_rank == 0) {
    try {
      group = ShmGroup::create(o);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_step_succeeded(world, kSetupStep, error);
  if (grouped && o.local_rank > 0) {
    try {
      group = ShmGroup::open(o);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_step_succeeded(world, kSetupStep, error);
  if (group) group->unlink_name();  // everyone has it mapped
  return group;
}

}  // namespace compcoll
