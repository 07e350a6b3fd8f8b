// The operations the backend hands to a lane's inner backend as they are
// (everything but the allreduces it compresses, see backend.h), and the one
// path that issues them in submission order: delegate().
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <exception>
#include <system_error>
#include <thread>

#include "integration/pytorch/csrc/backend.h"
#include "integration/pytorch/csrc/deferred_release.h"
#include "integration/pytorch/csrc/issue_scope.h"
#include "integration/pytorch/csrc/op_label.h"
#include "integration/pytorch/csrc/python_free.h"

namespace compcoll::torch_integration {
namespace {

// The works' OpType labels for the coalesced tensor collectives; torch
// releases without these names (setup.py probes) label them COALESCED.
#if COMPCOLL_TORCH_COALESCED_OPTYPES
constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::COALESCED;
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

// A collective whose inner work has no future (none of Gloo's today; its
// send and receive works, which have none, are handed to their caller's
// wait instead: work.h). Waited for on the worker, it would hold the worker
// while what is queued behind it waits: so a thread of its own waits, for
// at most the group's timeout (the watchdog bounds the work as well), and
// the worker goes on issuing.
void settle_when_done(c10::intrusive_ptr<c10d::Work> in, c10::intrusive_ptr<CompcollWork> work,
                      std::chrono::milliseconds timeout) {
  auto wait = [](c10::intrusive_ptr<c10d::Work> in, c10::intrusive_ptr<CompcollWork> work,
                 std::chrono::milliseconds timeout) {
    try {
      in->wait(timeout);
      work->complete();
    } catch (const std::exception&) {
      work->fail(std::current_exception());
    }
    DeferredRelease::keep(std::move(work));  // its last drop is never this thread's
  };
  try {
    // Owns what it touches (DeferredRelease holds `in` too), so detached.
    std::thread(wait, in, work, timeout).detach();
  } catch (const std::system_error&) {
    wait(std::move(in), std::move(work), timeout);  // no thread to be had: here, as before
  }
}

}  // namespace

void CompcollBackend::note_reduce_scatter(int64_t elems) {
  rs_calls_.fetch_add(1);
  rs_elems_.fetch_add(static_cast<uint64_t>(elems));
  if (!cfg_.compression_enabled() || static_cast<size_t>(elems) < cfg_.min_elems) return;
  int64_t largest = rs_largest_.load();
  while (elems > largest && !rs_largest_.compare_exchange_weak(largest, elems)) {
  }
  // Decided at the second: HSDP's allreduce of the first one's shard (on
  // another group) has been submitted by then.
  if (rs_eligible_.fetch_add(1) + 1 >= 2) report_reduce_scatters();
}

void CompcollBackend::report_reduce_scatters() {
  if (rs_eligible_.load() == 0 || compressible_candidates_.load() > 0) return;
  if (rs_warned_.exchange(true) || getRank() != 0) return;  // once per group
  const std::string what = "group '" + getGroupUid() + "': reduce-scatters (up to " +
                           std::to_string(rs_largest_.load()) +
                           " elements) went uncompressed, and no allreduce of this group so far "
                           "could be compressed: compcoll compresses allreduce only. ";
  if (compressible_candidates_in_process() > 0) {
    log_.info(what,
              "Other compcoll groups of this process compress their allreduces, as FSDP's "
              "HYBRID_SHARD and fully_shard on a 2-D mesh (HSDP) allreduce each reduced shard "
              "across replicas: that traffic between replicas is what is compressed "
              "(docs/pytorch.md, FSDP)");
    return;
  }
  log_.warn(what,
            "FSDP FULL_SHARD and SHARD_GRAD_OP, and FSDP2's fully_shard on a 1-D mesh, reduce "
            "gradients with reduce-scatter alone, so COMPCOLL_ALGO=", cfg_.algo,
            " saves nothing for them; DDP, FSDP NO_SHARD, and the allreduce across replicas of "
            "HYBRID_SHARD or fully_shard on a 2-D mesh (HSDP) are compressed (docs/pytorch.md, "
            "FSDP)");
}

uint64_t CompcollBackend::compressible_candidates_in_process() {
  uint64_t n = 0;
  for (const c10::intrusive_ptr<CompcollBackend>& b : live()) {
    n += b->compressible_candidates_.load();
  }
  return n;
}

// ------------------------------------------------------------ delegation --

c10::intrusive_ptr<c10d::Work> CompcollBackend::delegate(c10::Device device, c10d::OpType type,
                                                         const char* title,
                                                         std::vector<at::Tensor> outputs,
                                                         Issue issue,
                                                         std::chrono::milliseconds requested,
                                                         bool collective) {
  DeferredRelease::release_unshared();  // here, on the caller's thread
  const std::shared_ptr<Lane>& lane = lane_for(device);
  const std::chrono::milliseconds timeout = timeout_->for_operation(requested);
  // Builds the device lane's inner backend on its first operation: here, on
  // the caller's thread, before the queue lock (the factory takes the GIL).
  c10::intrusive_ptr<c10d::Backend> inner = lane->inner();
  const std::string what = op_label(title, outputs);
  // In order: nothing is ahead of it (or a callback on the worker issues
  // it). Issued by the caller, with the caller's current stream: the inner
  // backend handles streams itself.
  c10::intrusive_ptr<c10d::Work> direct;
  if (worker_->run_now_if_idle(what, [&] { direct = issue(*inner); })) {
    DeferredRelease::keep(direct);  // the inner thread's drop is never the last
    if (collective && device.is_cpu() && worker_->on_worker_thread()) {
      // Issued by a callback the worker runs: completed before the call
      // returns, so the future's own callbacks also run here, in order,
      // instead of on Gloo's thread, where an operation they issued would
      // queue behind this worker waiting for them. (Point-to-point
      // operations are matched by peer and tag, not by order: they stay
      // asynchronous, so a callback may post a receive before its send. A
      // device future completes at issue: NCCL orders it on the stream.)
      direct->wait(timeout);
      // Gloo may finish the work just before it completes the work's
      // future; then() on an incomplete future would run the callback on
      // Gloo's thread. The completion follows at once, so this wait is
      // bounded by the one above.
      c10::intrusive_ptr<c10::ivalue::Future> future;
      try {
        future = direct->getFuture();
      } catch (const std::exception&) {
        future.reset();  // a work without a future has no callbacks
      }
      if (future) future->wait();
    } else if (device.is_cpu()) {
      pass_scope_to_callbacks(direct);
    }
    return direct;
  }
  auto work = c10::make_intrusive<CompcollWork>(getRank(), type, title, std::move(outputs));
  if (timing_) work->time_from_now();
  if (!device.is_cpu()) {
    // Issued later by the worker: it must see the tensors as the caller's
    // stream leaves them now, and complete only when the outputs are there.
    const c10::impl::VirtualGuardImpl impl(device.type());
    auto ready = std::make_shared<c10::Event>(device.type());
    ready->record(impl.getStream(device));
    worker_->submit(what, work, [&]() -> Worker::Task {
      // The worker runs it with the timeout it gave it (ephemeral
      // extensions included) as the group's: get() on its thread.
      return [lane, work, inner, issue, ready, device, group_timeout = timeout_]() mutable {
        const std::chrono::milliseconds timeout = group_timeout->get();
        try {
          const std::optional<c10::Stream> stream = lane->worker_stream(device);
          c10::OptionalStreamGuard guard(stream);
          ready->block(*stream);
          c10::intrusive_ptr<c10d::Work> in = issue(*inner);
          DeferredRelease::keep(in);
          work->set_inner(in);
          work->hold(std::move(issue));
          in->wait(timeout);
          stream->synchronize();
          work->complete();  // with the stream current: the future's events are on it
        } catch (const std::exception&) {
          work->fail(std::current_exception());
        }
        DeferredRelease::keep(std::move(work));  // not dropped on the worker
      };
    }, timeout);
    return work;
  }
  // A send or receive: its caller's wait completes it (work.h, "handed").
  if (!collective) work->expect_handover();
  worker_->submit(what, work, [&]() -> Worker::Task {
    return [work, inner, issue, group_timeout = timeout_]() mutable {
      c10::intrusive_ptr<c10d::Work> in;
      try {
        in = issue(*inner);
      } catch (const std::exception& e) {
        work->fail(std::current_exception());
        DeferredRelease::keep(std::move(work));
        return;
      }
      DeferredRelease::keep(in);
      work->set_inner(in);
      work->hold(std::move(issue));  // its tensors go with the work, not the task
      c10::intrusive_ptr<c10::ivalue::Future> future;
      try {
        future = in->getFuture();
      } catch (const std::exception&) {
        future.reset();  // Gloo's send/recv works have no future
      }
      if (!future && work->expects_handover()) {
        work->complete_on_wait(std::move(in));  // the worker forgets it (finished_running)
        DeferredRelease::keep(std::move(work));
        return;
      }
      work->not_handed();
      if (future) {
        // Runs on the inner backend's thread, which must not drop the last
        // reference to this work either: it goes to DeferredRelease.
        future->addCallback([work](c10::ivalue::Future& f) mutable {
          if (f.hasError()) {
            work->fail(f.exception_ptr());
          } else {
            work->complete_with(f.value(), work->result());
          }
          DeferredRelease::keep(std::move(work));
        });
        return;
      }
      settle_when_done(std::move(in), std::move(work), group_timeout->get());
    };
  }, timeout);
  return work;
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::_ALLREDUCE_SPARSE,
                  "compcoll:all_reduce_sparse", tensors_alias,
                  [tensors_alias, opts](c10d::Backend& in) mutable {
                    return in.allreduce_sparse(tensors_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  auto tensors_alias = python_free(tensors);
  if (cfg_.compression_enabled() && getRank() == 0) {  // once per group
    const std::string note =
        uncompressed_notes_.first_coalesced(tensors_alias, opts.reduceOp, cfg_.min_elems);
    if (!note.empty()) log_.warn("group '", getGroupUid(), "': ", note);
  }
  return delegate(device_of(tensors_alias), c10d::OpType::ALLREDUCE_COALESCED,
                  "compcoll:all_reduce_coalesced", tensors_alias,
                  [tensors_alias, opts](c10d::Backend& in) mutable {
                    return in.allreduce_coalesced(tensors_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::BROADCAST, "compcoll:broadcast", tensors_alias,
                  [tensors_alias, opts](c10d::Backend& in) mutable {
                    return in.broadcast(tensors_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::REDUCE, "compcoll:reduce", tensors_alias,
                  [tensors_alias, opts](c10d::Backend& in) mutable { return in.reduce(tensors_alias, opts); },
                  opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  std::vector<at::Tensor> flat = flatten(outputs_alias);
  return delegate(device_of(inputs_alias, flat), c10d::OpType::ALLGATHER, "compcoll:all_gather", flat,
                  [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.allgather(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  auto output_alias = python_free(output);
  auto input_alias = python_free(input);
  return delegate(input_alias.device(), c10d::OpType::_ALLGATHER_BASE, "compcoll:_all_gather_base",
                  {output_alias}, [output_alias, input_alias, opts](c10d::Backend& in) mutable {
                    return in._allgather_base(output_alias, input_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto output_lists_alias = python_free(output_lists);
  auto inputs_alias = python_free(inputs);
  std::vector<at::Tensor> flat = flatten(output_lists_alias);
  return delegate(device_of(inputs_alias, flat), c10d::OpType::ALLGATHER_COALESCED,
                  "compcoll:all_gather_coalesced", flat,
                  [output_lists_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.allgather_coalesced(output_lists_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  return delegate(device_of(inputs_alias, outputs_alias), kAllgatherIntoTensorCoalesced,
                  "compcoll:all_gather_into_tensor_coalesced", outputs_alias,
                  [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.allgather_into_tensor_coalesced(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  std::vector<at::Tensor> flat = flatten(outputs_alias);
  return delegate(device_of(inputs_alias, flat), c10d::OpType::GATHER, "compcoll:gather", flat,
                  [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.gather(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  return delegate(device_of(outputs_alias), c10d::OpType::SCATTER, "compcoll:scatter", outputs_alias,
                  [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.scatter(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  int64_t elems = 0;
  for (const auto& list : inputs_alias) {
    for (const at::Tensor& t : list) elems += t.numel();
  }
  note_reduce_scatter(elems);
  return delegate(device_of(outputs_alias), c10d::OpType::REDUCE_SCATTER, "compcoll:reduce_scatter",
                  outputs_alias, [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.reduce_scatter(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto output_alias = python_free(output);
  auto input_alias = python_free(input);
  note_reduce_scatter(input_alias.numel());
  return delegate(input_alias.device(), c10d::OpType::_REDUCE_SCATTER_BASE,
                  "compcoll:_reduce_scatter_base", {output_alias},
                  [output_alias, input_alias, opts](c10d::Backend& in) mutable {
                    return in._reduce_scatter_base(output_alias, input_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  int64_t elems = 0;
  for (const at::Tensor& t : inputs_alias) elems += t.numel();
  note_reduce_scatter(elems);
  return delegate(device_of(inputs_alias, outputs_alias), kReduceScatterTensorCoalesced,
                  "compcoll:reduce_scatter_tensor_coalesced", outputs_alias,
                  [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.reduce_scatter_tensor_coalesced(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  auto output_alias = python_free(output);
  auto input_alias = python_free(input);
  return delegate(input_alias.device(), c10d::OpType::ALLTOALL_BASE, "compcoll:all_to_all_single",
                  {output_alias},
                  [output_alias, input_alias, output_splits, input_splits, opts](c10d::Backend& in) mutable {
                    return in.alltoall_base(output_alias, input_alias, output_splits, input_splits, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  auto outputs_alias = python_free(outputs);
  auto inputs_alias = python_free(inputs);
  return delegate(device_of(inputs_alias, outputs_alias), c10d::OpType::ALLTOALL, "compcoll:all_to_all",
                  outputs_alias, [outputs_alias, inputs_alias, opts](c10d::Backend& in) mutable {
                    return in.alltoall(outputs_alias, inputs_alias, opts);
                  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::SEND, "compcoll:send", tensors_alias,
                  [tensors_alias, dst, tag](c10d::Backend& in) mutable {
                    return in.send(tensors_alias, dst, tag);
                  },
                  c10d::kUnsetTimeout, /*collective=*/false);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::RECV, "compcoll:recv", tensors_alias,
                  [tensors_alias, src, tag](c10d::Backend& in) mutable {
                    return in.recv(tensors_alias, src, tag);
                  },
                  c10d::kUnsetTimeout, /*collective=*/false);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  auto tensors_alias = python_free(tensors);
  return delegate(device_of(tensors_alias), c10d::OpType::RECVANYSOURCE, "compcoll:recv_any_source",
                  tensors_alias, [tensors_alias, tag](c10d::Backend& in) mutable {
                    return in.recvAnysource(tensors_alias, tag);
                  },
                  c10d::kUnsetTimeout, /*collective=*/false);
}

c10::intrusive_ptr<c10d::Work> CompcollBackend::barrier(const c10d::BarrierOptions& opts) {
  // torch says which device the barrier is for (dist.barrier() picks cpu for
  // a group with a cpu backend); none: cpu, Gloo.
  const c10::Device device = opts.device.value_or(c10::Device(c10::kCPU));
  return delegate(device, c10d::OpType::BARRIER, "compcoll:barrier", {},
                  [opts](c10d::Backend& in) mutable { return in.barrier(opts); }, opts.timeout);
}

void CompcollBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Synchronous: everything submitted before it is issued first.
  worker_->run_and_wait("monitored_barrier", [] {});
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace compcoll::torch_integration
