#include "integration/pytorch/csrc/reference.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/config.h"

namespace compcoll::torch_integration {
namespace {

constexpr std::chrono::seconds kHubTimeout{60};

// What P threads share: one contribution slot per rank (and a P x P matrix
// for alltoallv), exchanged between two barriers.
class Hub {
 public:
  explicit Hub(int size) : size_(size), slot_(size), matrix_(size * size) {}

  void barrier(int rank) {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, kHubTimeout, [&] { return generation_ != gen; })) {
      CC_THROW(kTransport, "reference rank ", rank, ": peers did not arrive within ",
               kHubTimeout.count(), " s");
    }
  }
  Bytes& slot(int r) { return slot_[r]; }
  Bytes& cell(int from, int to) { return matrix_[from * size_ + to]; }

 private:
  int size_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<Bytes> slot_;
  std::vector<Bytes> matrix_;
};

template <typename T>
void sum_into(T* acc, const T* x, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kSum: acc[i] = acc[i] + x[i]; break;
      case ReduceOp::kMin: acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
      case ReduceOp::kMax: acc[i] = x[i] > acc[i] ? x[i] : acc[i]; break;
      case ReduceOp::kProd: acc[i] = acc[i] * x[i]; break;
      case ReduceOp::kAvg: CC_THROW(kInvalidArgument, "reference allreduce takes no AVG");
    }
  }
}

class LocalComm final : public Comm {
 public:
  LocalComm(Hub& hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return kHubTimeout; }

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override {
    check_own_part(send.size(), max_part, "allgatherv");
    hub_.slot(rank_).assign(send.begin(), send.end());
    hub_.barrier(rank_);
    Gathered g;
    g.offsets.assign(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) {
      g.offsets[r + 1] = g.offsets[r] + hub_.slot(r).size();
      g.data.insert(g.data.end(), hub_.slot(r).begin(), hub_.slot(r).end());
    }
    hub_.barrier(rank_);
    return g;
  }

  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override {
    CC_CHECK_EQ(static_cast<int>(send.size()), size_, kInvalidArgument, "alltoallv arity");
    for (const Bytes& b : send) check_own_part(b.size(), max_part, "alltoallv");
    for (int j = 0; j < size_; ++j) hub_.cell(rank_, j) = send[j];
    hub_.barrier(rank_);
    std::vector<Bytes> recv(size_);
    for (int j = 0; j < size_; ++j) recv[j] = hub_.cell(j, rank_);
    hub_.barrier(rank_);
    return recv;
  }

  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const size_t bytes = count * dtype_size(dtype);
    auto* p = static_cast<uint8_t*>(buf);
    hub_.slot(rank_).assign(p, p + bytes);
    hub_.barrier(rank_);
    Bytes acc = hub_.slot(0);  // rank order: the same arithmetic on every rank
    for (int r = 1; r < size_; ++r) {
      const uint8_t* x = hub_.slot(r).data();
      switch (dtype) {
        case DType::kFloat32:
          sum_into(reinterpret_cast<float*>(acc.data()), reinterpret_cast<const float*>(x), count, op);
          break;
        case DType::kFloat64:
          sum_into(reinterpret_cast<double*>(acc.data()), reinterpret_cast<const double*>(x), count, op);
          break;
        case DType::kInt32:
          sum_into(reinterpret_cast<int32_t*>(acc.data()), reinterpret_cast<const int32_t*>(x), count, op);
          break;
        case DType::kInt64:
          sum_into(reinterpret_cast<int64_t*>(acc.data()), reinterpret_cast<const int64_t*>(x), count, op);
          break;
        default:
          CC_THROW(kUnsupported, "reference allreduce of ", dtype_name(dtype));
      }
    }
    hub_.barrier(rank_);
    if (bytes) std::memcpy(buf, acc.data(), bytes);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(buf);
    if (rank_ == root) hub_.slot(root).assign(p, p + bytes);
    hub_.barrier(rank_);
    if (rank_ != root && bytes) std::memcpy(buf, hub_.slot(root).data(), bytes);
    hub_.barrier(rank_);
  }

  void barrier() override { hub_.barrier(rank_); }

 private:
  Hub& hub_;
  int rank_;
  int size_;
};

}  // namespace

std::vector<std::vector<at::Tensor>> reference_allreduce(
    const std::map<std::string, std::string>& config,
    const std::vector<std::vector<at::Tensor>>& inputs, bool average) {
  CC_CHECK(!inputs.empty() && !inputs[0].empty(), kInvalidArgument,
           "reference_allreduce needs at least one step of one rank");
  const int P = static_cast<int>(inputs[0].size());
  const size_t steps = inputs.size();
  std::vector<std::vector<at::Tensor>> outputs(steps, std::vector<at::Tensor>(P));
  for (size_t s = 0; s < steps; ++s) {
    CC_CHECK_EQ(static_cast<int>(inputs[s].size()), P, kInvalidArgument, "ranks in step ", s);
    for (int r = 0; r < P; ++r) {
      const at::Tensor& in = inputs[s][r];
      CC_CHECK(in.scalar_type() == at::kFloat, kInvalidArgument, "reference takes float32");
      outputs[s][r] = in.detach().to(at::kCPU).contiguous().clone();
    }
  }
  const EnvLookup env = [&config](const char* name) -> std::optional<std::string> {
    auto it = config.find(name);
    if (it == config.end()) return std::nullopt;
    return it->second;
  };
  Hub hub(P);
  std::vector<std::exception_ptr> errors(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      try {
        Config cfg = load_config(env);
        cfg.rank = r;
        cfg.world_size = P;
        cfg.stats_file.clear();
        Communicator comm(std::make_unique<LocalComm>(hub, r, P), cfg);
        for (size_t s = 0; s < steps; ++s) {
          at::Tensor& t = outputs[s][r];
          comm.allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), DType::kFloat32,
                         average ? ReduceOp::kAvg : ReduceOp::kSum, "reference");
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return outputs;
}

}  // namespace compcoll::torch_integration
