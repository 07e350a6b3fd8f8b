// The engine of the stand-in NCCL (tests only): the ranks of a communicator
// are threads of one process and all buffers are host memory.
//
// A collective is identified by (world, sequence number): each rank's call
// takes its communicator's next number. Ranks arrive() with their buffers;
// the last to arrive executes the whole collective for everyone (reductions
// in rank order), and the others observe done(). Nothing blocks: the stand-in
// CUDA driver runs arrive/done as stream tasks, so a missing peer shows up as
// a stream that never drains, exactly what a hung NCCL kernel looks like.
// Point-to-point messages go through per (source, destination) FIFOs.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fakenccl {

enum class Kind { kAllReduce, kAllGather, kBroadcast, kReduceScatter, kSplit };
const char* kind_name(Kind k);

// One rank's part of a collective.
struct Part {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // per-rank count (allgather: sent; reducescatter: received)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  int color = 0, key = 0;  // split
};

class World;

struct Comm {
  std::shared_ptr<World> world;
  int rank = 0;
  int id = 0;          // for the call log
  uint64_t next_seq = 0;
  std::atomic<ncclResult_t> async_error{ncclSuccess};  // set by stream tasks
  // A non-blocking communicator (ncclCommInitRankConfig, blocking = 0) is
  // still initialising for this many ncclCommGetAsyncError polls: until
  // then it reports ncclInProgress and refuses queries, as NCCL does.
  std::atomic<int> init_polls{0};
  bool destroyed = false;
  std::vector<Comm*> split_result;  // filled by a split collective, one per rank
};

// A new communicator handle. The stand-in never frees handles, so that a
// call on a destroyed communicator is reported as misuse instead of being
// a use after free; they are kept in a process-wide registry, which keeps
// them reachable (not leaks to LeakSanitizer) for the life of the process.
Comm* new_comm();

size_t type_size(ncclDataType_t t);

class World : public std::enable_shared_from_this<World> {
 public:
  World(int size, int id) : size_(size), id_(id) {}
  int size() const { return size_; }
  int id() const { return id_; }

  // Deposits rank's part of collective seq; the last rank executes it.
  void arrive(uint64_t seq, int rank, const Part& part);
  // Whether collective seq has finished (with an error when ranks disagreed
  // or the world was aborted, reported through *error).
  bool done(uint64_t seq, ncclResult_t* error);
  // Split results: the new communicator of `rank` (null for NOCOLOR).
  Comm* split_child(uint64_t seq, int rank);

  void post(int src, int dst, const void* data, size_t bytes);
  bool try_take(int src, int dst, void* data, size_t bytes, ncclResult_t* error);

  // Everything pending completes with ncclRemoteError; later ops fail too.
  void abort();
  bool aborted() const;

 private:
  struct Op {
    std::vector<Part> parts;
    int arrived = 0;
    bool done = false;
    ncclResult_t result = ncclSuccess;
    std::vector<Comm*> children;  // split
  };
  void execute(Op& op);  // caller holds mu_

  const int size_;
  const int id_;
  mutable std::mutex mu_;
  std::map<uint64_t, Op> ops_;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail_;
  bool aborted_ = false;
};

// Allocates a communicator id for the call log.
int next_comm_id();

}  // namespace fakenccl
