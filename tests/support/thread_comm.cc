#include "tests/support/thread_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "collectives/reduce_bytes.h"
#include "compcoll/error.h"

namespace compcoll::testing {

// The mailbox: deposits[src][dst] of the generation being gathered, and
// results[dst][src] of the last one completed. A rank takes its results
// before it can arrive at the next generation, and the next generation's
// results are written only once every rank has arrived there, so a
// generation's results are never overwritten while a rank still reads them.
class ThreadWorld {
 public:
  ThreadWorld(int size, std::chrono::milliseconds timeout)
      : size_(size),
        timeout_(timeout),
        deposits_(static_cast<size_t>(size)),
        arrived_(static_cast<size_t>(size), false),
        results_(static_cast<size_t>(size)) {}

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  std::vector<Bytes> exchange(int rank, std::vector<Bytes> out, const char* what) {
    std::unique_lock<std::mutex> lk(mu_);
    CC_CHECK(broken_.empty(), kTransport, "rank ", rank, ": ", what,
             " on an in-memory world that failed earlier: ", broken_);
    const uint64_t gen = generation_;
    deposits_[static_cast<size_t>(rank)] = std::move(out);
    arrived_[static_cast<size_t>(rank)] = true;
    if (++count_ == size_) {
      for (size_t dst = 0; dst < results_.size(); ++dst) {
        results_[dst].assign(deposits_.size(), Bytes());
        for (size_t src = 0; src < deposits_.size(); ++src) {
          results_[dst][src] = std::move(deposits_[src][dst]);
        }
      }
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || !broken_.empty(); })) {
      std::string missing;
      for (int r = 0; r < size_; ++r) {
        if (!arrived_[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      broken_ = detail::concat(what, ": rank(s) ", missing, " did not arrive within ",
                               timeout_.count(), " ms");
      cv_.notify_all();
    }
    CC_CHECK(generation_ != gen, kTransport, "rank ", rank, ": ", broken_);
    return std::move(results_[static_cast<size_t>(rank)]);
  }

 private:
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int count_ = 0;
  std::vector<std::vector<Bytes>> deposits_;
  std::vector<bool> arrived_;
  std::vector<std::vector<Bytes>> results_;
  std::string broken_;
};

ThreadComm::ThreadComm(std::shared_ptr<ThreadWorld> world, int rank)
    : world_(std::move(world)), rank_(rank) {}

int ThreadComm::size() const { return world_->size(); }
std::chrono::milliseconds ThreadComm::timeout() const { return world_->timeout(); }

std::vector<Bytes> ThreadComm::exchange(std::vector<Bytes> out, size_t max_part, const char* what) {
  for (size_t j = 0; j < out.size(); ++j) {
    check_own_part(out[j].size(), max_part, what);
    if (static_cast<int>(j) != rank_) bytes_sent_ += out[j].size();
  }
  std::vector<Bytes> in = world_->exchange(rank_, std::move(out), what);
  for (size_t src = 0; src < in.size(); ++src) {
    CC_CHECK(in[src].size() <= max_part, kTransport, "rank ", rank_, ": ",
             oversized_part_message(static_cast<int>(src), in[src].size(), max_part));
  }
  return in;
}

Gathered ThreadComm::allgatherv(std::span<const uint8_t> send, size_t max_part) {
  std::vector<Bytes> in =
      exchange(std::vector<Bytes>(static_cast<size_t>(size()), Bytes(send.begin(), send.end())),
               max_part, "allgatherv");
  Gathered g;
  g.offsets.assign(in.size() + 1, 0);
  for (size_t r = 0; r < in.size(); ++r) g.offsets[r + 1] = g.offsets[r] + in[r].size();
  g.data.reserve(g.offsets.back());
  for (const Bytes& part : in) g.data.insert(g.data.end(), part.begin(), part.end());
  return g;
}

std::vector<Bytes> ThreadComm::alltoallv(const std::vector<Bytes>& send, size_t max_part) {
  CC_CHECK_EQ(send.size(), static_cast<size_t>(size()), kInvalidArgument,
              "alltoallv needs one part per rank");
  return exchange(send, max_part, "alltoallv");
}

void ThreadComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  CC_CHECK(op != ReduceOp::kAvg, kInvalidArgument,
           "ThreadComm::allreduce takes SUM, MIN, MAX or PROD (AVG is the collectives' job)");
  const size_t bytes = count * dtype_size(dtype);
  const auto* p = static_cast<const uint8_t*>(buf);
  const Gathered all = allgatherv({p, bytes}, bytes);
  // In rank order from rank 0's part: the same bits on every rank.
  auto* out = static_cast<uint8_t*>(buf);
  std::memcpy(out, all.part(0).data(), bytes);
  for (int r = 1; r < all.parts(); ++r) {
    CC_CHECK_EQ(all.part(r).size(), bytes, kMismatch, "allreduce: rank ", r, " reduces ",
                all.part(r).size(), " bytes, this rank ", bytes);
    reduce_into(out, all.part(r).data(), count, dtype, op);
  }
}

void ThreadComm::broadcast(void* buf, size_t bytes, int root) {
  CC_CHECK(root >= 0 && root < size(), kInvalidArgument, "broadcast root ", root,
           " is outside [0, ", size(), ")");
  std::vector<Bytes> out(static_cast<size_t>(size()));
  if (rank_ == root) {
    const auto* p = static_cast<const uint8_t*>(buf);
    for (int r = 0; r < size(); ++r) {
      if (r != root) out[static_cast<size_t>(r)].assign(p, p + bytes);
    }
  }
  std::vector<Bytes> in = exchange(std::move(out), bytes, "broadcast");
  if (rank_ != root) {
    const Bytes& got = in[static_cast<size_t>(root)];
    CC_CHECK_EQ(got.size(), bytes, kMismatch, "broadcast: the root sent ", got.size(),
                " bytes, this rank expects ", bytes);
    std::memcpy(buf, got.data(), bytes);
  }
}

void ThreadComm::barrier() { exchange(std::vector<Bytes>(static_cast<size_t>(size())), 0, "barrier"); }

void run_thread_ranks(int world, const ThreadRankBody& body, std::chrono::milliseconds timeout) {
  auto shared = std::make_shared<ThreadWorld>(world, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::chrono::steady_clock::time_point> when(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadComm comm(shared, r);
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        when[static_cast<size_t>(r)] = std::chrono::steady_clock::now();
      }
    });
  }
  for (auto& t : threads) t.join();
  int first = -1;
  for (int r = 0; r < world; ++r) {
    if (errors[static_cast<size_t>(r)] &&
        (first < 0 || when[static_cast<size_t>(r)] < when[static_cast<size_t>(first)])) {
      first = r;
    }
  }
  if (first < 0) return;
  try {
    std::rethrow_exception(errors[static_cast<size_t>(first)]);
  } catch (const Error& e) {
    throw Error(e.kind(), detail::concat("rank ", first, " of ", world, ": ", e.what()));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kInternal, detail::concat("rank ", first, " of ", world, ": ", e.what()));
  }
}

}  // namespace compcoll::testing
