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
// Wire cost: a leader sends what it would send on a communicator of leaders,
// plus the world alltoallv's 8-byte size headers to every rank.
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

  // A follower's side of one leader phase; returns after the leaders' release().
  static void follow(Comm& world);

 private:
  // One world alltoallv: to[j] goes to leader j (to.size() == size()).
  // Returns what each leader sent this one, by leader index.
  std::vector<Bytes> exchange(std::vector<Bytes> to, size_t max_part, uint8_t token);

  Comm& world_;
  std::vector<int> leaders_;
  std::vector<int> index_of_;  // world rank -> leader index, -1 for followers
  int index_ = -1;
};

}  // namespace compcoll
