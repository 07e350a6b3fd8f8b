#include "collectives/leader_comm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/reduce_bytes.h"
#include "compcoll/error.h"
#include "compression/payload.h"

namespace compcoll {
namespace {

// A phase's status: world rank 0 sends it to every follower in each
// exchange, and every leader appends its own to each part it sends another
// leader (a one-byte trailer), so that a leader that failed is known to all.
constexpr uint8_t kDone = 0;    // the phase ends with this exchange
constexpr uint8_t kMore = 1;    // another exchange follows
constexpr uint8_t kFailed = 2;  // a leader failed: the phase ends, failing
// A follower's kFailed names up to this many failed leaders (u32 world ranks).
constexpr size_t kNamedFailures = 16;
constexpr size_t kFollowerTokenMax = 1 + 4 * kNamedFailures;

std::string list_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += detail::concat(i ? ", " : "", ranks[i]);
  return out;
}

// Shard j of `count` elements over `parts`: balanced, the first count % parts
// shards one element longer.
size_t shard_begin(size_t count, size_t parts, size_t j) {
  return count / parts * j + std::min(j, count % parts);
}

}  // namespace

LeaderComm::LeaderComm(Comm& world, std::vector<int> leaders)
    : world_(world), leaders_(std::move(leaders)), index_of_(static_cast<size_t>(world.size()), -1) {
  CC_CHECK(!leaders_.empty() && leaders_[0] == 0, kInternal,
           "the leaders must start with world rank 0");
  for (size_t j = 0; j < leaders_.size(); ++j) {
    const int w = leaders_[j];
    CC_CHECK(w >= 0 && w < world.size() && index_of_[static_cast<size_t>(w)] < 0, kInternal,
             "leader ", j, " is world rank ", w, ": outside the world or repeated");
    index_of_[static_cast<size_t>(w)] = static_cast<int>(j);
  }
  index_ = index_of_[static_cast<size_t>(world.rank())];
  CC_CHECK(index_ >= 0, kInternal, "world rank ", world.rank(), " is not a leader");
}

LeaderComm::Traded LeaderComm::trade(std::vector<Bytes> to, size_t max_part, uint8_t status,
                                     const std::vector<int>& failed) {
  const int P = world_.size();
  std::vector<Bytes> send(static_cast<size_t>(P));
  for (size_t j = 0; j < leaders_.size(); ++j) {
    to[j].push_back(status);
    send[static_cast<size_t>(leaders_[j])] = std::move(to[j]);
  }
  if (world_.rank() == 0) {
    Bytes token{status};
    if (status == kFailed) {
      for (size_t i = 0; i < std::min(failed.size(), kNamedFailures); ++i) {
        token.resize(token.size() + 4);
        store_le<uint32_t>(token.data() + token.size() - 4, static_cast<uint32_t>(failed[i]));
      }
    }
    for (int r = 0; r < P; ++r) {
      if (index_of_[static_cast<size_t>(r)] < 0) send[static_cast<size_t>(r)] = token;
    }
  }
  std::vector<Bytes> got;
  try {
    // + 1: the status trailer (saturating: max_part may be kUnboundedPart).
    const size_t bound = max_part == kUnboundedPart ? max_part : max_part + 1;
    got = world_.alltoallv(send, std::max(bound, kFollowerTokenMax));
  } catch (...) {
    world_failed_ = true;  // no further exchange is attempted on it
    throw;
  }
  // Every part's status first, then its checks: a leader that failed is
  // named whatever else this exchange brought (see exchange()).
  Traded out;
  out.parts.resize(leaders_.size());
  out.rank0_status = kDone;  // unless rank 0's part says otherwise
  for (int r = 0; r < P; ++r) {
    const int j = index_of_[static_cast<size_t>(r)];
    Bytes& part = got[static_cast<size_t>(r)];
    std::string problem;
    if (j < 0) {
      if (!part.empty()) {
        problem = detail::concat("rank ", world_.rank(), ": rank ", r, " is not a host leader but "
                                 "sent ", part.size(), " bytes during a leader exchange");
      }
    } else if (part.empty() || part.back() > kFailed) {
      problem = detail::concat("rank ", world_.rank(), ": leader rank ", r, " sent a part without a "
                               "valid status byte during a leader exchange");
    } else {
      if (part.back() == kFailed) out.failed.push_back(r);
      if (r == 0) out.rank0_status = part.back();
      if (part.size() - 1 > max_part) {
        problem = detail::concat("rank ", world_.rank(), ": leader rank ", r, " sent ",
                                 part.size() - 1, " bytes, more than the call's bound of ", max_part);
      }
      out.parts[static_cast<size_t>(j)] = std::move(part);
    }
    if (out.problem.empty()) out.problem = std::move(problem);
  }
  return out;
}

std::vector<Bytes> LeaderComm::exchange(std::vector<Bytes> to, size_t max_part, uint8_t token) {
  CC_CHECK(!phase_failed_ && !world_failed_, kTransport, "rank ", world_.rank(),
           ": the host leaders' communicator failed earlier in this phase");
  Traded t = trade(std::move(to), max_part, token, {});
  if (!t.failed.empty()) {
    end_failed_phase(t.rank0_status, t.failed);
    CC_THROW(kTransport, "world rank ", world_.rank(), " (a host leader): host leader(s) at world "
             "rank(s) ", list_ranks(t.failed), " failed during this call's phase between hosts "
             "(their own errors name the cause), so it fails on every rank");
  }
  if (!t.problem.empty()) {
    // Seen by this leader alone: the others go on, and its caller's
    // abandon() tells them in their next exchange, unless this one ended
    // the phase (rank 0 told the followers kDone: there is none).
    if (t.rank0_status == kDone) phase_failed_ = true;
    CC_THROW(kTransport, t.problem);
  }
  for (Bytes& part : t.parts) part.pop_back();
  return std::move(t.parts);
}

void LeaderComm::end_failed_phase(uint8_t rank0_status, const std::vector<int>& failed) {
  phase_failed_ = true;
  // Followers that were told kMore wait for one more exchange: it tells them.
  // Every leader reaches the same decision from world rank 0's status.
  if (rank0_status == kMore) trade(std::vector<Bytes>(leaders_.size()), 0, kFailed, failed);
}

void LeaderComm::abandon() noexcept {
  if (phase_failed_ || world_failed_) return;  // the others know already, or cannot be told
  try {
    // The others are in whatever exchange their phase has reached, with
    // parts of a size this leader cannot know: unbounded, on this one
    // exchange of a failing call. Its own part says kFailed, so `failed`
    // holds it.
    const Traded t = trade(std::vector<Bytes>(leaders_.size()), kUnboundedPart, kFailed,
                           {world_.rank()});
    end_failed_phase(t.rank0_status, t.failed);
  } catch (...) {
    // The caller rethrows its own error; the others fail by theirs.
    phase_failed_ = true;
  }
}

Gathered LeaderComm::allgatherv(std::span<const uint8_t> send, size_t max_part) {
  check_own_part(send.size(), max_part, "allgatherv");
  std::vector<Bytes> to(leaders_.size());
  for (size_t j = 0; j < to.size(); ++j) to[j].assign(send.begin(), send.end());
  std::vector<Bytes> got = exchange(std::move(to), max_part, kMore);
  Gathered out;
  out.offsets.assign(got.size() + 1, 0);
  for (size_t j = 0; j < got.size(); ++j) out.offsets[j + 1] = out.offsets[j] + got[j].size();
  out.data.resize(out.offsets.back());
  for (size_t j = 0; j < got.size(); ++j) {
    if (!got[j].empty()) std::memcpy(out.data.data() + out.offsets[j], got[j].data(), got[j].size());
  }
  return out;
}

std::vector<Bytes> LeaderComm::alltoallv(const std::vector<Bytes>& send, size_t max_part) {
  CC_CHECK_EQ(send.size(), leaders_.size(), kInvalidArgument,
              "the leaders' alltoallv needs one payload per leader");
  for (const Bytes& b : send) check_own_part(b.size(), max_part, "alltoallv");
  return exchange(send, max_part, kMore);
}

void LeaderComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  CC_CHECK(op != ReduceOp::kAvg, kInvalidArgument,
           "the leaders' allreduce takes SUM, PROD, MIN or MAX; AVG is the caller's division");
  CC_CHECK(buf != nullptr || count == 0, kInvalidArgument, "allreduce of ", count,
           " elements from a null buffer");
  const size_t H = leaders_.size();
  if (H == 1) return;
  const size_t es = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(buf);
  const auto begin = [&](size_t j) { return shard_begin(count, H, j); };
  const size_t largest = (count / H + (count % H ? 1 : 0)) * es;

  // Round 1: shard j of every leader's buffer to leader j.
  std::vector<Bytes> to(H);
  for (size_t j = 0; j < H; ++j) to[j].assign(bytes + begin(j) * es, bytes + begin(j + 1) * es);
  std::vector<Bytes> got = exchange(std::move(to), largest, kMore);
  const size_t me = static_cast<size_t>(index_);
  const size_t mine = (begin(me + 1) - begin(me)) * es;
  for (size_t j = 0; j < H; ++j) {
    CC_CHECK_EQ(got[j].size(), mine, kTransport, "rank ", world_.rank(), ": leader ", j,
                " sent a shard of ", got[j].size(), " bytes for a ", mine, "-byte shard");
  }
  // In leader order, so the shard's bits do not depend on who reduces it.
  Bytes acc = std::move(got[0]);
  for (size_t j = 1; j < H; ++j) reduce_into(acc.data(), got[j].data(), mine / es, dtype, op);

  // Round 2: every reduced shard to everyone.
  std::vector<Bytes> all(H, acc);
  got = exchange(std::move(all), largest, kMore);
  for (size_t j = 0; j < H; ++j) {
    const size_t len = (begin(j + 1) - begin(j)) * es;
    CC_CHECK_EQ(got[j].size(), len, kTransport, "rank ", world_.rank(), ": leader ", j,
                " sent a reduced shard of ", got[j].size(), " bytes for a ", len, "-byte shard");
    if (len) std::memcpy(bytes + begin(j) * es, got[j].data(), len);
  }
}

void LeaderComm::broadcast(void* buf, size_t bytes, int root) {
  CC_CHECK(root >= 0 && root < size(), kInvalidArgument, "broadcast root ", root,
           " is outside the ", size(), " leaders");
  CC_CHECK(buf != nullptr || bytes == 0, kInvalidArgument, "broadcast of ", bytes,
           " bytes from a null buffer");
  std::vector<Bytes> to(leaders_.size());
  if (index_ == root) {
    const auto* p = static_cast<const uint8_t*>(buf);
    for (size_t j = 0; j < to.size(); ++j) {
      if (static_cast<int>(j) != root) to[j].assign(p, p + bytes);
    }
  }
  std::vector<Bytes> got = exchange(std::move(to), bytes, kMore);
  if (index_ == root) return;
  Bytes& part = got[static_cast<size_t>(root)];
  CC_CHECK_EQ(part.size(), bytes, kTransport, "rank ", world_.rank(), ": the broadcast root sent ",
              part.size(), " bytes for a ", bytes, "-byte broadcast");
  if (bytes) std::memcpy(buf, part.data(), bytes);
}

void LeaderComm::barrier() { exchange(std::vector<Bytes>(leaders_.size()), 0, kMore); }

void LeaderComm::release() { exchange(std::vector<Bytes>(leaders_.size()), 0, kDone); }

void LeaderComm::follow(Comm& world) {
  const int P = world.size();
  // Each round is one world call, bounded by the world's timeout; the
  // leaders decide how many there are.
  while (true) {
    std::vector<Bytes> got =
        world.alltoallv(std::vector<Bytes>(static_cast<size_t>(P)), kFollowerTokenMax);
    for (int r = 1; r < P; ++r) {
      CC_CHECK(got[static_cast<size_t>(r)].empty(), kTransport, "rank ", world.rank(),
               ": rank ", r, " sent ", got[static_cast<size_t>(r)].size(),
               " bytes to a rank that is not a host leader");
    }
    const Bytes& token = got[0];
    const bool failed = !token.empty() && token[0] == kFailed && (token.size() - 1) % 4 == 0;
    CC_CHECK(failed || (token.size() == 1 && (token[0] == kDone || token[0] == kMore)),
             kTransport, "rank ", world.rank(), ": rank 0 sent a ", token.size(),
             "-byte control token during a leader phase (expected 1 byte, 0 or 1, or a failure)");
    if (failed) {
      std::vector<int> ranks;
      for (size_t at = 1; at < token.size(); at += 4) {
        ranks.push_back(static_cast<int>(load_le<uint32_t>(token.data() + at)));
      }
      CC_THROW(kTransport, "world rank ", world.rank(), " (not a host leader): the host leaders "
               "failed this call's phase between hosts; failed: world rank(s) ",
               ranks.empty() ? std::string("unknown") : list_ranks(ranks),
               " (their own errors name the cause)");
    }
    if (token[0] == kDone) return;
  }
}

}  // namespace compcoll
