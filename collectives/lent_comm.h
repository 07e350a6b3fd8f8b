// A non-owning view of a Comm, for owners that must keep their transport
// while lending it to a Communicator (which owns the Comm it is given): the
// NCCL interposer, tests over the thread harness. With on_call, it also runs
// that as each collective starts and ends (the host hierarchy's leaders tell
// their host's ranks they are still at work: LocalGroup::note_progress).
#pragma once

#include <functional>
#include <utility>

#include "collectives/comm.h"

namespace compcoll {

class LentComm final : public Comm {
 public:
  explicit LentComm(Comm& c, std::function<void()> on_call = {})
      : c_(c), on_call_(std::move(on_call)) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::chrono::milliseconds timeout() const override { return c_.timeout(); }
  Gathered allgatherv(std::span<const uint8_t> s, size_t max_part) override {
    const Call c(*this);
    return c_.allgatherv(s, max_part);
  }
  Gathered allgatherv_overlapping(std::span<const uint8_t> s, size_t max_part,
                                  const std::function<void()>& meanwhile) override {
    const Call c(*this);
    return c_.allgatherv_overlapping(s, max_part, meanwhile);
  }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& s, size_t max_part) override {
    const Call c(*this);
    return c_.alltoallv(s, max_part);
  }
  void allreduce(void* b, size_t n, DType d, ReduceOp o) override {
    const Call c(*this);
    c_.allreduce(b, n, d, o);
  }
  void broadcast(void* b, size_t n, int root) override {
    const Call c(*this);
    c_.broadcast(b, n, root);
  }
  void barrier() override {
    const Call c(*this);
    c_.barrier();
  }
  uint64_t bytes_sent() const override { return c_.bytes_sent(); }
  bool can_connect_subgroup() const override { return c_.can_connect_subgroup(); }
  std::unique_ptr<Comm> connect_subgroup(const std::vector<int>& members,
                                         const std::string& name) override {
    return c_.connect_subgroup(members, name);
  }

 private:
  // Runs on_call_ at construction and destruction (also when the call throws).
  struct Call {
    explicit Call(const LentComm& l) : l_(l) { l_.tick(); }
    ~Call() { l_.tick(); }
    const LentComm& l_;
  };
  void tick() const {
    if (on_call_) on_call_();
  }

  Comm& c_;
  std::function<void()> on_call_;
};

}  // namespace compcoll
