#include "integration/pytorch/csrc/backend.h"

#include <Python.h>

#include <exception>
#include <stdexcept>

#include "compcoll/error.h"
#include "integration/pytorch/csrc/torch_comm.h"
#include "integration/pytorch/csrc/work.h"

namespace compcoll::torch_integration {
namespace {

// Live backends, for the exit hook (weak: the registry never keeps one alive).
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<c10::weak_intrusive_ptr<CompcollBackend>>& registry() {
  static std::vector<c10::weak_intrusive_ptr<CompcollBackend>> r;
  return r;
}

// Errors reach Python as RuntimeError; make sure they name compcoll.
std::exception_ptr as_compcoll_error(const std::exception& e) {
  const std::string what = e.what();
  if (dynamic_cast<const Error*>(&e) != nullptr || what.rfind("compcoll", 0) == 0) {
    return std::make_exception_ptr(std::runtime_error(what));
  }
  return std::make_exception_ptr(std::runtime_error("compcoll: " + what));
}

// Runs fn without the GIL when this thread holds it (a backend destroyed or
// finished from Python must not block the worker, whose future callbacks
// may need the GIL).
template <typename Fn>
void without_gil(Fn&& fn) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    try {
      fn();
    } catch (...) {
      PyEval_RestoreThread(state);
      throw;
    }
    PyEval_RestoreThread(state);
  } else {
    fn();
  }
}

}  // namespace

CompcollBackend::CompcollBackend(c10::intrusive_ptr<c10d::Backend> inner,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(inner->getRank(), inner->getSize()),
      inner_(std::move(inner)),
      timeout_(timeout),
      cfg_(load_config()),
      log_(cfg_.debug, inner_->getRank()) {
  init();
  // The process group decides who is who; torchrun's RANK/WORLD_SIZE (which
  // load_config falls back to) describe the world, not this group.
  cfg_.rank = getRank();
  cfg_.world_size = getSize();
  cfg_.timeout = timeout_;
  comm_ = std::make_unique<Communicator>(std::make_unique<TorchComm>(inner_, timeout_), cfg_);
  worker_ = std::thread([this] { worker_loop(); });
  log_.info("torch backend over ", inner_->getBackendName(), ": ", getSize(), " ranks, algo ",
            cfg_.algo, ", timeout ", timeout_.count(), " ms");
}

CompcollBackend::~CompcollBackend() {
  try {
    finish();
  } catch (const std::exception& e) {
    log_.warn("finishing the torch backend failed: ", e.what());
  }
  stop_worker();
}

std::vector<c10::intrusive_ptr<CompcollBackend>> CompcollBackend::live() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<c10::intrusive_ptr<CompcollBackend>> out;
  auto& r = registry();
  for (auto it = r.begin(); it != r.end();) {
    if (auto p = it->lock()) {
      out.push_back(std::move(p));
      ++it;
    } else {
      it = r.erase(it);
    }
  }
  return out;
}

c10::intrusive_ptr<CompcollBackend> CompcollBackend::create(
    c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout) {
  auto b = c10::make_intrusive<CompcollBackend>(std::move(inner), timeout);
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().emplace_back(b);
  return b;
}

// ---------------------------------------------------------------- worker --

void CompcollBackend::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Waits for work without a deadline: the worker is idle until the
      // backend stops, and stop_worker() wakes it.
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    task();  // tasks report their own errors through their work
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void CompcollBackend::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (!worker_.joinable()) return;
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();  // the last reference died in a callback on the worker
    return;
  }
  without_gil([&] { worker_.join(); });
}

void CompcollBackend::run_on_worker(const std::function<void()>& fn) {
  auto done = std::make_shared<std::pair<bool, std::exception_ptr>>(false, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    CC_CHECK(!stopping_, kInvalidArgument, "the torch backend has been shut down");
    queue_.push_back([this, fn, done] {
      try {
        fn();
      } catch (...) {
        done->second = std::current_exception();
      }
      std::lock_guard<std::mutex> l(mu_);
      done->first = true;
    });
  }
  work_cv_.notify_one();
  bool finished = false;
  without_gil([&] {
    std::unique_lock<std::mutex> lock(mu_);
    // Everything queued before fn must finish first; each of those waits at
    // most the timeout for its inner operations, so allow for a queue.
    finished = idle_cv_.wait_for(lock, timeout_ + std::chrono::seconds(5),
                                 [&] { return done->first; });
  });
  CC_CHECK(finished, kTransport, "rank ", getRank(),
           ": the torch backend's worker did not finish within ", timeout_.count(), " ms");
  if (done->second) std::rethrow_exception(done->second);
}

void CompcollBackend::drain() { run_on_worker([] {}); }

void CompcollBackend::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || stopping_) return;
    finished_ = true;
  }
  run_on_worker([this] { comm_->finish(); });
}

std::string CompcollBackend::stats_json() {
  std::string out;
  run_on_worker([&] {
    out = comm_->stats().json(comm_->rank(), comm_->size(), cfg_.algo, comm_->state_bytes());
  });
  return out;
}

size_t CompcollBackend::state_entries() {
  size_t n = 0;
  run_on_worker([&] { n = comm_->state_entries(); });
  return n;
}

std::vector<SlotInfo> CompcollBackend::slots() {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.slots();
}

std::vector<BufferSlots::TraceEntry> CompcollBackend::key_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  return {slots_.trace().begin(), slots_.trace().end()};
}

// ------------------------------------------------------------ delegation --

template <typename Issue>
c10::intrusive_ptr<c10d::Work> CompcollBackend::delegate(c10d::OpType type, const char* title,
                                                         std::vector<at::Tensor> outputs,
                                                         Issue issue) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!busy_ && queue_.empty()) return issue();  // in order: nothing is ahead of it
  auto work = c10::make_intrusive<CompcollWork>(getRank(), type, title, std::move(outputs));
  queue_.push_back([work, issue]() mutable {
    c10::intrusive_ptr<c10d::Work> inner;
    try {
      inner = issue();
    } catch (const std::exception& e) {
      work->fail(std::current_exception());
      return;
    }
    work->set_inner(inner);
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = inner->getFuture();
    } catch (const std::exception&) {
      future.reset();  // Gloo's send/recv works have no future
    }
    if (future) {
      future->addCallback([work](c10::ivalue::Future& f) {
        if (f.hasError()) {
          work->fail(f.exception_ptr());
        } else {
          work->complete_with(f.value(), work->result());
        }
      });
      return;
    }
    try {
      inner->wait();
      work->complete();
    } catch (const std::exception&) {
      work->fail(std::current_exception());
    }
  });
  lock.unlock();
  work_cv_.notify_one();
  return work;
}

bool CompcollBackend::is_candidate(const std::vector<at::Tensor>& tensors,
                                   const c10d::AllreduceOptions& opts, DType* dtype,
                                   ReduceOp* op) const {
  if (tensors.size() != 1 || opts.sparseIndices.has_value()) return false;
  const at::Tensor& t = tensors[0];
  if (!t.device().is_cpu() || t.layout() != at::kStrided || !t.is_contiguous()) return false;
  const auto st = t.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) return false;
  if (opts.reduceOp == c10d::ReduceOp::SUM) {
    *op = ReduceOp::kSum;
  } else if (opts.reduceOp == c10d::ReduceOp::AVG) {
    *op = ReduceOp::kAvg;
  } else {
    return false;
  }
  return to_compcoll_dtype(st, dtype);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  DType dtype;
  ReduceOp op;
  if (!is_candidate(tensors, opts, &dtype, &op)) {
    return delegate(c10d::OpType::ALLREDUCE, "compcoll:all_reduce", tensors,
                    [this, tensors, opts]() mutable { return inner_->allreduce(tensors, opts); });
  }
  at::Tensor t = tensors[0];
  auto work = c10::make_intrusive<CompcollWork>(getRank(), c10d::OpType::ALLREDUCE,
                                                "compcoll:all_reduce", tensors);
  {
    std::lock_guard<std::mutex> lock(mu_);
    CC_CHECK(!stopping_, kInvalidArgument, "allreduce on a torch backend that has shut down");
    // Keys are assigned in submission order, on the caller's thread, while
    // the tensor is certainly alive. Tensors the policy keeps dense (the
    // algorithm is dense, or fewer than COMPCOLL_MIN_ELEMS elements) need
    // no state and get no slot.
    SlotAssignment a{"", SlotEvent::kSame, 0};
    if (cfg_.compression_enabled() && static_cast<size_t>(t.numel()) >= cfg_.min_elems) {
      a = slots_.assign(t);
    }
    if (a.event == SlotEvent::kFresh || a.event == SlotEvent::kResized) {
      // A warning, not info: dropping a residual must never be silent.
      log_.warn("error-feedback state ", a.key, ": a new buffer of ", t.numel(),
                " elements replaced a freed one; the freed buffer's residual (", a.dropped_elems,
                " elements) is dropped",
                a.event == SlotEvent::kFresh
                    ? " (first replacement, as at DDP's bucket rebuild: its layout may differ)"
                    : " (different size)");
    } else if (a.event != SlotEvent::kSame) {
      log_.trace("error-feedback state ", a.key, " for ", t.numel(), " elements: ",
                 slot_event_name(a.event));
    }
    queue_.push_back([this, work, t, dtype, op, key = a.key, dropped = a.dropped_key] {
      try {
        if (!dropped.empty()) comm_->drop_state(dropped);  // free it now, not at eviction
        comm_->allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), dtype, op,
                         key.empty() ? nullptr : key.c_str());
      } catch (const std::exception& e) {
        work->fail(as_compcoll_error(e));
        return;
      }
      work->complete();
    });
  }
  work_cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return delegate(c10d::OpType::_ALLREDUCE_SPARSE, "compcoll:all_reduce_sparse", tensors,
                  [this, tensors, opts]() mutable { return inner_->allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return delegate(
      c10d::OpType::ALLREDUCE_COALESCED, "compcoll:all_reduce_coalesced", tensors,
      [this, tensors, opts]() mutable { return inner_->allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return delegate(c10d::OpType::BROADCAST, "compcoll:broadcast", tensors,
                  [this, tensors, opts]() mutable { return inner_->broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return delegate(c10d::OpType::REDUCE, "compcoll:reduce", tensors,
                  [this, tensors, opts]() mutable { return inner_->reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> flat;
  for (const auto& v : outputs) flat.insert(flat.end(), v.begin(), v.end());
  return delegate(c10d::OpType::ALLGATHER, "compcoll:all_gather", flat,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->allgather(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return delegate(c10d::OpType::_ALLGATHER_BASE, "compcoll:_all_gather_base", {output},
                  [this, output, input, opts]() mutable {
                    return inner_->_allgather_base(output, input, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> flat;
  for (const auto& v : output_lists) flat.insert(flat.end(), v.begin(), v.end());
  return delegate(c10d::OpType::ALLGATHER_COALESCED, "compcoll:all_gather_coalesced", flat,
                  [this, output_lists, inputs, opts]() mutable {
                    return inner_->allgather_coalesced(output_lists, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return delegate(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED,
                  "compcoll:all_gather_into_tensor_coalesced", outputs,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->allgather_into_tensor_coalesced(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  std::vector<at::Tensor> flat;
  for (const auto& v : outputs) flat.insert(flat.end(), v.begin(), v.end());
  return delegate(c10d::OpType::GATHER, "compcoll:gather", flat,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->gather(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return delegate(c10d::OpType::SCATTER, "compcoll:scatter", outputs,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->scatter(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegate(c10d::OpType::REDUCE_SCATTER, "compcoll:reduce_scatter", outputs,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->reduce_scatter(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return delegate(c10d::OpType::_REDUCE_SCATTER_BASE, "compcoll:_reduce_scatter_base", {output},
                  [this, output, input, opts]() mutable {
                    return inner_->_reduce_scatter_base(output, input, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegate(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                  "compcoll:reduce_scatter_tensor_coalesced", outputs,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  return delegate(c10d::OpType::ALLTOALL_BASE, "compcoll:all_to_all_single", {output},
                  [this, output, input, output_splits, input_splits, opts]() mutable {
                    return inner_->alltoall_base(output, input, output_splits, input_splits,
                                                 opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return delegate(c10d::OpType::ALLTOALL, "compcoll:all_to_all", outputs,
                  [this, outputs, inputs, opts]() mutable {
                    return inner_->alltoall(outputs, inputs, opts);
                  });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return delegate(c10d::OpType::SEND, "compcoll:send", tensors,
                  [this, tensors, dst, tag]() mutable { return inner_->send(tensors, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return delegate(c10d::OpType::RECV, "compcoll:recv", tensors,
                  [this, tensors, src, tag]() mutable { return inner_->recv(tensors, src, tag); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return delegate(c10d::OpType::RECVANYSOURCE, "compcoll:recv_any_source", tensors,
                  [this, tensors, tag]() mutable { return inner_->recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::barrier(const c10d::BarrierOptions& opts) {
  return delegate(c10d::OpType::BARRIER, "compcoll:barrier", {},
                  [this, opts]() mutable { return inner_->barrier(opts); });
}

void CompcollBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  drain();  // synchronous: everything submitted before it is issued first
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

void CompcollBackend::setTimeout(std::chrono::milliseconds timeout) {
  inner_->setTimeout(timeout);
}

void CompcollBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  inner_->setGroupUid(pg_uid);
}

void CompcollBackend::setBoundDeviceId(std::optional<at::Device> device) {
  c10d::Backend::setBoundDeviceId(device);
  inner_->setBoundDeviceId(device);
}

void CompcollBackend::eagerConnectSingleDevice(at::Device device) {
  inner_->eagerConnectSingleDevice(device);
}

void CompcollBackend::abort() {
  inner_->abort();
}

void CompcollBackend::shutdown() {
  try {
    finish();
  } catch (const std::exception& e) {
    log_.warn("finishing the torch backend at shutdown failed: ", e.what());
  }
  inner_->shutdown();
}

}  // namespace compcoll::torch_integration
