// GlooComm's point-to-point collectives. allreduce is in gloo_allreduce.cc.
//
// allgatherv and alltoallv send each peer one message, a size header
// followed by the payload when the payload fits an eager bound (allgatherv:
// the previous call's largest part, which every rank saw; alltoallv: per
// pair, the previous call's part between the two), with room to grow: the
// receivers post buffers of that bound, so the usual call (sparse payloads
// of about the same size every time) is one round; a part above the bound
// follows in a second round, its size known from the first. Every Gloo send is a
// rendezvous (announce, receiver ready, data) ending in two wake-ups, which
// on a loaded machine cost more than the bytes (docs/scaling.md). Every rank
// talks to every other rank directly, and each rank sends exactly its own
// bytes once per receiver (plus the 8-byte header); zero-byte payloads send
// only the header.
// broadcast is root-to-all; barrier is the dissemination barrier
// (ceil(log2 P) rounds of one byte).
#include "transport/gloo_comm.h"

#include <gloo/context.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <utility>

#include "compcoll/error.h"
#include "transport/call_scope.h"
#include "transport/peer_addresses.h"

namespace compcoll {

namespace {

// allgatherv's and alltoallv's rounds: a size header with the payload when
// it fits the eager bound, then the payloads that did not.
constexpr uint8_t kPhaseEager = 0;
constexpr uint8_t kPhasePayload = 1;

// Round 1's message for one part: its size, and the part itself when it
// fits the pair's eager bound.
Bytes eager_message(std::span<const uint8_t> part, size_t bound) {
  const uint64_t n = part.size();
  Bytes m(sizeof n + (part.size() <= bound ? part.size() : 0));
  std::memcpy(m.data(), &n, sizeof n);
  if (m.size() > sizeof n) std::memcpy(m.data() + sizeof n, part.data(), part.size());
  return m;
}

// The size at the front of a round-1 message.
uint64_t announced_size(const uint8_t* message) {
  uint64_t n = 0;
  std::memcpy(&n, message, sizeof n);
  return n;
}

}  // namespace

GlooComm::GlooComm(std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds timeout,
                   std::vector<std::vector<std::string>> peer_addresses)
    : context_(std::move(context)),
      rank_(context_ ? context_->rank : 0),
      size_(context_ ? context_->size : 0),
      timeout_(timeout),
      peer_addresses_(std::move(peer_addresses)) {
  CC_CHECK(context_ != nullptr, kInvalidArgument,
           "GlooComm needs a connected gloo::Context, got null");
  CC_CHECK(timeout_.count() > 0, kInvalidArgument,
           "GlooComm timeout must be positive, got ", timeout_.count(), " ms");
  peer_addresses_.resize(static_cast<size_t>(size_));
  a2a_bound_out_.assign(static_cast<size_t>(size_), 0);
  a2a_bound_in_.assign(static_cast<size_t>(size_), 0);
}

GlooComm::~GlooComm() = default;

std::unique_ptr<Comm> GlooComm::connect_subgroup(const std::vector<int>& members,
                                                 const std::string& name) {
  CC_CHECK(subgroup_connector_ != nullptr, kUnsupported, who(),
           ": this communicator was built without a rendezvous store to connect subgroups through");
  CC_CHECK(std::is_sorted(members.begin(), members.end()) &&
               std::adjacent_find(members.begin(), members.end()) == members.end(),
           kInvalidArgument, who(), ": subgroup members must be distinct and ascending");
  CC_CHECK(std::find(members.begin(), members.end(), rank_) != members.end(), kInvalidArgument,
           who(), ": only a member connects to subgroup '", name, "'");
  for (int m : members) {
    CC_CHECK(m >= 0 && m < size_, kInvalidArgument, who(), ": subgroup member ", m,
             " is outside [0, ", size_, ")");
  }
  check_usable("connect_subgroup");
  std::unique_ptr<GlooComm> sub = subgroup_connector_(members, name);
  sub->parent_sent_ = subgroups_sent_;
  return sub;
}

std::string GlooComm::who() const {
  return detail::concat("rank ", rank_, "/", size_);
}

void GlooComm::check_usable(const char* op) const {
  CC_CHECK(!broken_, kTransport, who(), ": ", op,
           ": this communicator is broken by an earlier transport error and "
           "must be rebuilt (create a new one, e.g. with connect_gloo, on "
           "every rank); original error: ",
           broken_reason_);
}

std::string GlooComm::name_peers(const std::string& msg) const {
  return name_peer_addresses(msg, peer_addresses_);
}

void GlooComm::fail(const std::string& what, bool timed_out) {
  std::string msg = detail::concat(who(), ": ", what, name_peers(what));
  broken_ = true;
  broken_reason_ = msg;
  // Close every connection so that peers blocked on us fail now instead of
  // at their timeout; a communicator is unusable after this anyway.
  try {
    context_->closeConnections();
  } catch (...) {
    // Pairs already in an error state may refuse; nothing more to do.
  }
  if (timed_out) CC_THROW_TIMEOUT(timeout_, msg);
  CC_THROW(kTransport, msg);
}

size_t GlooComm::eager_bound(size_t last_part) const {
  // Room to grow (a sparse payload's size moves a little from call to
  // call), and the staging buffers of a call within kEagerStagingBytes
  // whatever P.
  const size_t per_peer_cap = kEagerStagingBytes / static_cast<size_t>(std::max(size_, 1));
  return std::min(last_part + last_part / 8 + 64, per_peer_cap);
}

Gathered GlooComm::allgatherv(std::span<const uint8_t> send, size_t max_part) {
  return allgatherv_overlapping(send, max_part, nullptr);
}

Gathered GlooComm::allgatherv_overlapping(std::span<const uint8_t> send, size_t max_part,
                                          const std::function<void()>& meanwhile) {
  check_own_part(send.size(), max_part, "allgatherv");
  CallScope call(*this, "allgatherv");
  const size_t p = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  // Every rank saw the same parts last call, so every rank has this bound.
  const size_t eager = eager_allgatherv_;
  const size_t stride = sizeof(uint64_t) + eager;

  // Round 1: to every peer, this rank's size, and the payload with it when
  // it fits the eager bound. Receives are posted for the bound: Gloo takes
  // a message shorter than the posted buffer.
  const bool my_eager = send.size() <= eager;
  const Bytes mine = eager_message(send, eager);
  std::vector<uint8_t> inbox(stride * p);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    call.recv(peer, inbox.data() + stride * static_cast<size_t>(peer), stride, kPhaseEager);
    call.send(peer, mine.data(), mine.size(), kPhaseEager);
  }
  // Gloo's loop thread moves the messages while this thread works.
  std::exception_ptr meanwhile_failed;
  if (meanwhile) {
    try {
      meanwhile();
    } catch (...) {
      meanwhile_failed = std::current_exception();
    }
  }
  call.wait_all();

  std::vector<uint64_t> sizes(p, 0);
  for (size_t r = 0; r < p; ++r) {
    sizes[r] = r == me ? send.size() : announced_size(inbox.data() + stride * r);
  }
  Gathered out;
  out.offsets.resize(p + 1, 0);
  size_t largest = 0;
  for (size_t r = 0; r < p; ++r) {
    if (sizes[r] > max_part) call.fail(oversized_part_message(int(r), sizes[r], max_part));
    if (sizes[r] > std::numeric_limits<size_t>::max() - out.offsets[r]) {
      call.fail(detail::concat("rank ", r, " announced ", sizes[r],
                               " bytes; the total overflows size_t"));
    }
    out.offsets[r + 1] = out.offsets[r] + static_cast<size_t>(sizes[r]);
    largest = std::max(largest, static_cast<size_t>(sizes[r]));
  }
  try {
    out.data.resize(out.offsets[p]);
  } catch (const std::exception& e) {  // bad_alloc, length_error: announced sizes we cannot hold
    call.fail(detail::concat("cannot hold the ", out.offsets[p], " bytes the ranks announced (",
                             e.what(), ")"));
  }

  // Round 2, only for parts above the bound: their senders send them to
  // every peer, and every peer knows their sizes from round 1.
  for (size_t r = 0; r < p; ++r) {
    uint8_t* dst = out.data.data() + out.offsets[r];
    if (r == me) {
      if (!send.empty()) std::memcpy(dst, send.data(), send.size());
    } else if (sizes[r] <= eager) {
      if (sizes[r] != 0) std::memcpy(dst, inbox.data() + stride * r + sizeof(uint64_t), sizes[r]);
    } else {
      call.recv(int(r), dst, sizes[r], kPhasePayload);
    }
  }
  if (!my_eager) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) call.send(peer, send.data(), send.size(), kPhasePayload);
    }
  }
  call.wait_all();
  eager_allgatherv_ = eager_bound(largest);
  // Only now: every peer got this rank's part and the ranks stay in step.
  if (meanwhile_failed) std::rethrow_exception(meanwhile_failed);
  return out;
}

std::vector<Bytes> GlooComm::alltoallv(const std::vector<Bytes>& send, size_t max_part) {
  CC_CHECK_EQ(send.size(), static_cast<size_t>(size_), kInvalidArgument, who(),
              ": alltoallv needs one payload per rank");
  for (const Bytes& b : send) check_own_part(b.size(), max_part, "alltoallv");
  CallScope call(*this, "alltoallv");
  const size_t p = static_cast<size_t>(size_);
  // Round 1, as allgatherv's, with a bound per pair: what i sent j last
  // call is what j received from i, so both derive the same bound from it.
  std::vector<Bytes> first(p);
  std::vector<size_t> inbox_at(p + 1, 0);
  for (size_t j = 0; j < p; ++j) {
    inbox_at[j + 1] = inbox_at[j] + (j == size_t(rank_) ? 0 : sizeof(uint64_t) + a2a_bound_in_[j]);
  }
  std::vector<uint8_t> inbox(inbox_at[p]);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const size_t pr = static_cast<size_t>(peer);
    first[pr] = eager_message(send[pr], a2a_bound_out_[pr]);
    call.recv(peer, inbox.data() + inbox_at[pr], inbox_at[pr + 1] - inbox_at[pr], kPhaseEager);
    call.send(peer, first[pr].data(), first[pr].size(), kPhaseEager);
  }
  call.wait_all();

  std::vector<uint64_t> in_sizes(p, 0);
  for (size_t j = 0; j < p; ++j) {
    if (j != size_t(rank_)) in_sizes[j] = announced_size(inbox.data() + inbox_at[j]);
  }
  // Every announcement is checked before any payload is posted: a refusal
  // sends nothing further.
  for (int peer = 0; peer < size_; ++peer) {
    const uint64_t announced = in_sizes[static_cast<size_t>(peer)];
    if (peer != rank_ && announced > max_part) call.fail(oversized_part_message(peer, announced, max_part));
  }
  std::vector<Bytes> out(p);
  out[static_cast<size_t>(rank_)] = send[static_cast<size_t>(rank_)];
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const size_t pr = static_cast<size_t>(peer);
    try {
      out[pr].resize(static_cast<size_t>(in_sizes[pr]));
    } catch (const std::exception& e) {  // bad_alloc, length_error
      call.fail(detail::concat("cannot hold the ", in_sizes[pr], "-byte payload rank ", peer,
                               " announced (", e.what(), ")"));
    }
    if (in_sizes[pr] <= a2a_bound_in_[pr]) {
      if (in_sizes[pr] != 0) {
        std::memcpy(out[pr].data(), inbox.data() + inbox_at[pr] + sizeof(uint64_t), in_sizes[pr]);
      }
    } else {
      call.recv(peer, out[pr].data(), out[pr].size(), kPhasePayload);
    }
    if (send[pr].size() > a2a_bound_out_[pr]) {
      call.send(peer, send[pr].data(), send[pr].size(), kPhasePayload);
    }
  }
  call.wait_all();
  for (size_t j = 0; j < p; ++j) {
    a2a_bound_out_[j] = eager_bound(send[j].size());
    a2a_bound_in_[j] = eager_bound(static_cast<size_t>(in_sizes[j]));
  }
  return out;
}

void GlooComm::broadcast(void* buf, size_t bytes, int root) {
  CC_CHECK(root >= 0 && root < size_, kInvalidArgument, who(),
           ": broadcast root ", root, " is outside [0, ", size_, ")");
  CC_CHECK(buf != nullptr || bytes == 0, kInvalidArgument, who(),
           ": broadcast of ", bytes, " bytes from a null buffer");
  CallScope call(*this, "broadcast");
  if (rank_ == root) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) call.send(peer, buf, bytes, kPhasePayload);
    }
  } else {
    call.recv(root, buf, bytes, kPhasePayload);
  }
  call.wait_all();
}

void GlooComm::barrier() {
  CallScope call(*this, "barrier");
  // Dissemination barrier: in round k every rank signals rank + 2^k and
  // waits for rank - 2^k. After ceil(log2 P) rounds every rank has
  // (transitively) heard from every other one.
  uint8_t token_out = 1;
  uint8_t phase = 0;
  for (int dist = 1; dist < size_; dist *= 2, ++phase) {
    uint8_t token_in = 0;
    call.send((rank_ + dist) % size_, &token_out, 1, phase);
    call.recv((rank_ - dist + size_) % size_, &token_in, 1, phase);
    call.wait_all();
  }
}

}  // namespace compcoll
