// LeaderComm: the communicator of the host leaders (one rank per host, see
// host_layout.h), built on the world Comm so that every algorithm runs
// unchanged between the leaders over whatever transport the world has (Gloo,
// NCCL, the PyTorch backend's inner group), without a second connection.
//
// Terms:
//   leader phase  a stretch of LeaderComm calls made by the leaders only (an
//                 algorithm's allreduce, auto's link measurement). Meanwhile
//                 every other rank (a follower) runs follow().
//   exchange      every LeaderComm call is one or two world alltoallv calls
//                 in which leaders send each other what the leader-level call
//                 needs; followers send nothing. In each exchange world rank 0
//                 (the leader of host 0) also sends every follower a one-byte
//                 token, kMore; release() ends the phase with a last exchange
//                 whose token is kDone. So followers make exactly as many
//                 world calls as the leaders, without knowing in advance how
//                 many an algorithm needs.
//   failure       a leader whose phase throws (a payload it rejects, a
//                 codec error) calls abandon(): its next exchange carries
//                 kFailed in a one-byte status trailer on each part to
//                 another leader (every part has one), so the other leaders'
//                 exchange fails too, naming it, and rank 0 tells the
//                 followers (kFailed and the failed world ranks), in that
//                 exchange or, when it had told them kMore, in one more. So
//                 no rank waits out the timeout for a phase that has ended.
// Wire cost: a leader sends what it would send on a communicator of leaders,
// plus the world alltoallv's 8-byte size headers to every rank and the
// one-byte status trailer per part.
//
// allreduce is a reduce-scatter then allgather over the leaders: leader j
// reduces shard j of all leaders' buffers in leader order and sends the
// result to everyone, so every leader holds the same bits (2 (H-1)/H of the
// buffer sent per leader, like a ring, in two exchanges).
//
// Errors: the world Comm's (a dead rank or a timeout anywhere breaks every
// rank's world calls within the timeout); a part of the wrong size or a
// follower sending data is kTransport.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/comm.h"

namespace compcoll {

class LeaderComm final : public Comm {
 public:
  // leaders: world ranks of the leaders, by host index; leaders[0] must be 0
  // and world.rank() one of them. world must outlive this object.
  LeaderComm(Comm& world, std::vector<int> leaders);

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(leaders_.size()); }
  std::chrono::milliseconds timeout() const override { return world_.timeout(); }

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override;
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;
  // The world Comm's counter: what this rank put on the wire.
  uint64_t bytes_sent() const override { return world_.bytes_sent(); }

  // Ends a leader phase (every leader calls it once): followers return from
  // follow().
  void release();

  // A leader whose phase failed on its own (not in an exchange that named
  // another leader's failure) calls it before rethrowing: the other leaders
  // and the followers then fail at once instead of at the timeout. Never
  // throws; a no-op when the phase already failed in an exchange or the
  // world failed.
  void abandon() noexcept;

  // A follower's side of one leader phase; returns after the leaders'
  // release(), throws kTransport naming the failed leaders after a failure.
  static void follow(Comm& world);

 private:
  // What one exchange brought: each leader's part by leader index (its
  // status trailer still on; empty where the part was refused), the world
  // ranks of the leaders that said kFailed, world rank 0's status (kDone
  // when its part was unusable), and the first problem found in a part.
  struct Traded {
    std::vector<Bytes> parts;
    std::vector<int> failed;
    uint8_t rank0_status = 0;
    std::string problem;
  };
  // One world alltoallv: to[j] goes to leader j (to.size() == size()), with
  // this leader's status appended. Rank 0 sends followers `status` (and
  // `failed` when it is kFailed). Throws only when the world call does.
  Traded trade(std::vector<Bytes> to, size_t max_part, uint8_t status,
               const std::vector<int>& failed);
  // trade() with `token`, and the statuses checked: a leader that failed
  // fails this one (end_failed_phase first); trailers removed.
  std::vector<Bytes> exchange(std::vector<Bytes> to, size_t max_part, uint8_t token);
  // After an exchange that showed failures: the one more exchange that
  // tells the followers, when rank 0 had told them kMore in it.
  void end_failed_phase(uint8_t rank0_status, const std::vector<int>& failed);

  Comm& world_;
  std::vector<int> leaders_;
  std::vector<int> index_of_;  // world rank -> leader index, -1 for followers
  int index_ = -1;
  bool phase_failed_ = false;  // a leader failed: this communicator's phase is over
  bool world_failed_ = false;  // a world call threw: nothing more is sent on it
};

}  // namespace compcoll
