// TorchComm: the Comm seam over an inner torch c10d backend (the
// ProcessGroupGloo or ProcessGroupNCCL created by the PyTorch backend), so
// the Python extension never loads a second copy of Gloo or NCCL: every byte
// compcoll sends travels through torch's own.
//
// Staging device: the seam passes host memory. Without a staging device the
// inner backend gets cpu tensors over that memory (Gloo). With one, every
// inner operation takes tensors on that device: the host bytes are copied
// into freshly allocated staging tensors on the thread's current stream, the
// inner operation runs on them, and what it produced is copied back to host
// memory (a synchronous copy: complete when the call returns). NCCL needs
// the device (the lane's cuda device); "cpu" makes real copies through the
// same code, which is how the tests run the staging path without a GPU.
//
// How each seam call maps onto the inner backend (every call waits for its
// inner work with the communicator's timeout):
//   allgatherv  all_gather of one int64 size per rank, then all_gather of
//               uint8 payloads padded to the largest size (skipped when every
//               payload is empty).
//   alltoallv   all_to_all of P int64 sizes, then all_to_all_single of the
//               concatenated payloads with those split sizes.
//   allreduce   the inner allreduce (exact; kAvg is rejected, the collectives
//               sum and divide).
//   broadcast   the inner broadcast of a uint8 view.
//   barrier     the inner barrier.
//
// Bytes sent (bytes_sent()), per rank, what the inner collectives put on the
// wire for this rank: Gloo's all_gather is a ring, each rank forwards P-1
// blocks, so an allgather of a padded payload of B bytes counts (P-1)*B (and
// (P-1)*8 for the sizes); an all_to_all counts what this rank sends to its
// P-1 peers (and (P-1)*8 for the sizes); allreduce counts a ring's
// 2(P-1)/P of the buffer (ring_allreduce_bytes, the same reference the
// compression ratio is quoted against); broadcast counts the payload once
// per child of this rank in a binomial tree rooted at root; barrier counts 0.
// Gloo's message headers are not counted. Over NCCL the same formulas are
// used: they describe the reference algorithms, not whichever one NCCL picks
// (a ring all-gather sends exactly these bytes). With a staging device,
// barrier is an allreduce of one int32 and still counts 0.
//
// After the first failure the communicator is broken: every further call
// throws kTransport, as the seam requires. Used by one thread at a time (the
// backend's worker thread).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "collectives/comm.h"
#include "integration/pytorch/csrc/group_timeout.h"

namespace compcoll::torch_integration {

class TorchComm final : public Comm {
 public:
  // timeout: the group's, read at each wait (it follows dist.set_timeout).
  TorchComm(c10::intrusive_ptr<c10d::Backend> inner, std::shared_ptr<const GroupTimeout> timeout,
            std::optional<c10::Device> staging = std::nullopt);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_->get(); }

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override;
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

  uint64_t bytes_sent() const override { return bytes_sent_; }
  const std::optional<c10::Device>& staging() const { return staging_; }

 private:
  // Waits for an inner work item; converts any failure into kTransport and
  // marks the communicator broken.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what);
  // Runs issue() (which returns the inner work) under the broken-state rules.
  template <typename Issue>
  void run(const char* what, Issue&& issue);
  void check_usable(const char* what) const;
  // host (cpu) as the inner backend takes it: itself, or a copy on the
  // staging device.
  at::Tensor to_inner(const at::Tensor& host) const;
  // An uninitialised output of n elements where the inner backend takes it.
  at::Tensor inner_empty(int64_t n, c10::ScalarType dtype) const;
  // An inner output in host memory: itself, or a completed copy.
  at::Tensor to_host(const at::Tensor& t) const;
  // Breaks the communicator (kTransport) when a peer announced a negative
  // size or more than max_part (see Comm::allgatherv).
  void refuse_part(int peer, int64_t announced, size_t max_part);

  c10::intrusive_ptr<c10d::Backend> inner_;
  int rank_;
  int size_;
  std::shared_ptr<const GroupTimeout> timeout_;
  std::optional<c10::Device> staging_;
  std::string inner_name_;  // "gloo", "nccl": for messages
  uint64_t bytes_sent_ = 0;
  std::string broken_;
};

// Bytes a rank sends in a binomial-tree broadcast of `bytes` from root.
uint64_t tree_broadcast_bytes(int rank, int size, int root, uint64_t bytes);

// compcoll's dtype for a torch scalar type; false when there is none.
bool to_compcoll_dtype(c10::ScalarType t, DType* out);

}  // namespace compcoll::torch_integration
