#include "integration/pytorch/csrc/backend.h"

#include <algorithm>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <exception>
#include <stdexcept>

#include "collectives/dense.h"
#include "compcoll/error.h"
#include "integration/pytorch/csrc/deferred_release.h"
#include "integration/pytorch/csrc/group_stats.h"
#include "integration/pytorch/csrc/issue_scope.h"
#include "integration/pytorch/csrc/op_label.h"
#include "integration/pytorch/csrc/python_free.h"
#include "integration/pytorch/csrc/torch_comm.h"
#include "plugin/stats.h"

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

// Errors reach Python as RuntimeError; make sure they name compcoll, and
// (context, "rank 0/2, group '0': all_reduce (...)") the operation and group.
std::exception_ptr as_compcoll_error(const std::exception& e, const std::string& context) {
  const std::string what = message_without_prefix(e);
  return std::make_exception_ptr(std::runtime_error(
      "compcoll: " + (context.empty() ? what : context + " failed: " + what)));
}

// The error of a candidate that failed. A transport failure (a peer gone,
// stuck or refused by it) leaves the group unusable on this rank: the
// failure board is told, and says which other ranks failed and which are
// silent, gone or stuck (failure_board.h).
std::exception_ptr candidate_error(const std::exception& e, const std::string& context,
                                   FailureBoard* board) {
  const auto* error = dynamic_cast<const Error*>(&e);
  if (board == nullptr || error == nullptr || error->kind() != ErrorKind::kTransport) {
    return as_compcoll_error(e, context);
  }
  const std::string failure = context + " failed: " + message_without_prefix(e);
  return std::make_exception_ptr(
      std::runtime_error("compcoll: " + with_account(failure, board->report(failure))));
}

// The route's reason, in the Communicator's log, for a candidate sent exact
// because of its group (mark_tensor_parallel) or where it was issued
// (issue_scope.h).
constexpr const char* kOutsideBackward =
    "issued outside a backward pass, COMPCOLL_TORCH_SCOPE=backward";
constexpr const char* kBatchStatistics =
    "SyncBatchNorm's batch statistics: values, though issued in backward";
constexpr const char* kTensorParallel =
    "a tensor-parallel group's: activations, not gradient sums";
constexpr const char* kActivationsInBackward =
    "issued in backward inside an autograd node that sums activations (checkpoint "
    "recomputation, a differentiable allreduce's backward)";
constexpr const char* kSelfCompressingHook =
    "issued by a DDP comm hook that compresses gradients itself (PowerSGD)";

// The worker's part of a candidate: reduce (host, or t in place), copy a
// staged result back into t, complete work. Owns what it touches (see
// worker.h: it may outlive the backend).
void run_candidate(const std::shared_ptr<Lane>& lane, const std::shared_ptr<const Config>& cfg,
                   const std::shared_ptr<const GroupTimeout>& timeout,
                   const c10::intrusive_ptr<CompcollWork>& work,
                   const at::Tensor& t, const at::Tensor& host, DType dtype, ReduceOp op,
                   const std::string& key, const std::string& order_key,
                   const std::string& dropped, const std::string& merged,
                   const std::string& context,
                   const char* exact_reason, const std::shared_ptr<FailureBoard>& board) {
  try {
    const std::optional<c10::Stream> stream =
        lane->staged() ? lane->worker_stream(t.device()) : std::nullopt;
    // The staging copies and the inner (NCCL) operations run on the worker's
    // stream, never queued behind the user's work on the default stream.
    c10::OptionalStreamGuard guard(stream);
    try {
      Communicator& comm =
          lane->ensure_comm(*cfg, timeout, lane->staged() ? lane->device : std::nullopt);
      if (!dropped.empty()) comm.drop_state(dropped);  // free it now, not at eviction
      if (!merged.empty()) comm.merge_state(merged, key);  // buffer_slots.h
      comm.set_discard_nonfinite(CompcollBackend::loss_scaled());
      const at::Tensor& buf = lane->staged() ? host : t;
      if (exact_reason != nullptr) {
        comm.allreduce_exact(buf.data_ptr(), static_cast<size_t>(t.numel()), dtype, op,
                             exact_reason);
      } else {
        comm.set_handover_order_key(order_key);
        comm.allreduce(buf.data_ptr(), static_cast<size_t>(t.numel()), dtype, op,
                       key.empty() ? nullptr : key.c_str());
      }
      // non_blocking=false: the result is in t when copy_ returns, so
      // before the work completes.
      if (lane->staged()) t.copy_(host);
    } catch (const std::exception& e) {
      work->fail(candidate_error(e, context, board.get()));
      return;
    }
    work->complete();  // with the stream current: a device future's events are on it
  } catch (const std::exception& e) {
    work->fail(as_compcoll_error(e, context));  // no stream for the device
  }
}

}  // namespace

CompcollBackend::CompcollBackend(c10::intrusive_ptr<c10d::Backend> inner,
                                 std::chrono::milliseconds timeout, DeviceLaneSpec device_lane,
                                 StatsIdentity stats_id, std::string state_tag,
                                 std::string log_group, c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(inner->getRank(), inner->getSize()),
      inner_(std::move(inner)),
      timeout_(std::make_shared<GroupTimeout>(timeout)),
      cfg_(load_config(env_read_by(FrontEnd::kTorchBackend))),
      log_(cfg_.debug, inner_->getRank()),
      stats_id_(stats_id) {
  init();
  // The process group decides who is who; torchrun's RANK/WORLD_SIZE (which
  // load_config falls back to) describe the world, not this group.
  cfg_.rank = getRank();
  cfg_.world_size = getSize();
  cfg_.timeout = timeout;
  cfg_.front_end = FrontEnd::kTorchBackend;  // what it takes from the group, it does not read
  cfg_.state_tag = std::move(state_tag);
  if (stats_id_.rank < 0) stats_id_ = {getRank(), getSize()};
  Config lane_cfg = cfg_;
  // One file per process, written by finish(); each lane's communicator
  // checks at creation, with the other ranks, that it can be written.
  if (!cfg_.stats_file.empty()) {
    lane_cfg.owner_stats_path = stats_path(cfg_.stats_file, stats_id_.rank);
    // One file per process: the job's processes share it without {rank}
    // (said by the job's rank 0, once per process).
    static std::atomic<bool> said{false};
    const std::string shared = stats_file_shared_warning(cfg_.stats_file, stats_id_.world_size);
    if (!shared.empty() && stats_id_.rank == 0 && !said.exchange(true)) log_.warn(shared);
  }
  lane_cfg.stats_file.clear();
  lane_cfg.log_group = std::move(log_group);
  lane_cfg_ = std::make_shared<const Config>(std::move(lane_cfg));
  host_ = std::make_shared<Lane>("cpu", c10::DeviceType::CPU, inner_);
  host_->ensure_comm(*lane_cfg_, timeout_, std::nullopt);
  if (device_lane.factory) {
    CC_CHECK(!device_lane.name.empty() && device_lane.name != host_->name(), kInvalidArgument,
             "the device lane needs a name of its own, not '", device_lane.name, "'");
    device_ = std::make_shared<Lane>(device_lane.name, device_lane.type,
                                     std::move(device_lane.factory));
  }
  if (store) {
    board_ = std::make_shared<FailureBoard>(std::move(store), getRank(), getSize(), timeout_);
  }
  worker_ = Worker::start(getRank(), getSize(), timeout_, log_, board_);
  log_.info("torch backend over ", inner_->getBackendName(),
            device_ ? " (" + device_->name() + " tensors: a lane built on first use)" : "", ": ",
            getSize(), " ranks, algo ", cfg_.algo, ", timeout ", timeout.count(), " ms");
}

CompcollBackend::~CompcollBackend() {
  if (board_) board_->close();  // operations failing from here on post nothing
  try {
    finish(FinishAt::kGroupEnd);
  } catch (const std::exception& e) {
    log_.warn("finishing the torch backend failed: ", e.what());
  }
  // Bounded as finish() is at a group's end: a worker held by an operation
  // that no peer will match is left behind, to end at its deadline. Not
  // waited for a second time when finish() has waited for it already.
  worker_->stop(end_called_off_ ? std::chrono::milliseconds(0) : kEndDrainBound);
}

std::vector<c10::intrusive_ptr<CompcollBackend>> CompcollBackend::live() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<c10::intrusive_ptr<CompcollBackend>> out;
  auto& r = registry();
  const pid_t self = getpid();
  for (auto it = r.begin(); it != r.end();) {
    if (auto p = it->lock()) {
      // A child forked after the group was made inherits the backend but
      // not its threads: finishing it there would wait for a worker that is
      // not there (the group's timeout at the child's exit) and write the
      // parent's stats and state files from a copy.
      if (p->created_by_ == self) out.push_back(std::move(p));
      ++it;
    } else {
      it = r.erase(it);
    }
  }
  return out;
}

c10::intrusive_ptr<CompcollBackend> CompcollBackend::create(
    c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout,
    DeviceLaneSpec device_lane, StatsIdentity stats_id, std::string state_tag,
    std::string log_group, c10::intrusive_ptr<c10d::Store> store) {
  auto b = c10::make_intrusive<CompcollBackend>(std::move(inner), timeout, std::move(device_lane),
                                                stats_id, std::move(state_tag),
                                                std::move(log_group), std::move(store));
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().emplace_back(b);
  return b;
}

// ---------------------------------------------------------------- worker --

GroupStats CompcollBackend::group_stats_skeleton() const {
  GroupStats g;
  g.group = getGroupUid();
  g.rank = getRank();
  g.world_size = getSize();
  g.algo = cfg_.algo;
  g.reduce_scatter_calls = rs_calls_.load();
  g.reduce_scatter_elems = rs_elems_.load();
  const OptimizerMomentum taken = optimizer_momentum_.load();
  g.optimizer_momentum = taken.m;
  g.optimizer_momentum_moved = taken.moved;
  g.loss_scale_changes = loss_scale_changes_.load();
  return g;
}

void CompcollBackend::finish(FinishAt at) {
  DeferredRelease::release_unshared();
  if (finished_.exchange(true)) return;
  report_reduce_scatters();  // a job with one reduce-scatter is not silent either
  if (!worker_->broken().empty()) return;  // its worker cannot be reached; nothing to write
  // The task owns what it touches (worker.h); the file is written on the
  // worker, after everything submitted so far.
  auto task = [host = host_, device = device_, g = group_stats_skeleton(),
               path = cfg_.stats_file.empty() ? std::string()
                                              : stats_path(cfg_.stats_file, stats_id_.rank),
               id = stats_id_, log = log_]() mutable {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      if (lane == nullptr) continue;
      if (lane->comm() != nullptr) lane->comm()->finish();  // its summary line
      LaneStats x;
      if (read_lane_stats(*lane, &x)) g.lanes.push_back(x);
    }
    if (path.empty()) return;
    if (!record_group_stats(path, id.rank, id.world_size, g)) {
      log.warn("cannot write COMPCOLL_STATS_FILE ", path);
    }
  };
  if (at == FinishAt::kRequest) {
    worker_->run_and_wait("finish (stats)", task);
    return;
  }
  // At the end, a peer that is stopped or gone without a reset (or an
  // operation no peer matches) would hold destroy_process_group or the
  // process's exit for the group's timeout (30 minutes by default) behind
  // what waits on it: the task may wait kEndDrainBound to start. Not started by
  // then, it is called off (it will do nothing if the worker reaches it as
  // the process ends), so the group's stats are not written; once started,
  // it writes under the group's deadline as usual. The error-feedback state
  // is then saved, if at all, when the lanes' communicators are released
  // (~Communicator): only if the held operation completed, since a
  // communicator whose call failed refuses to save.
  enum Phase : int { kWaiting, kStarted, kCalledOff };
  auto phase = std::make_shared<std::atomic<int>>(kWaiting);
  auto guarded = [phase, task = std::move(task)]() mutable {
    int expected = kWaiting;
    if (phase->compare_exchange_strong(expected, kStarted)) task();
  };
  std::string holding;  // read before the call-off: the task itself may start right after
  const auto started_or_call_off = [&] {
    holding = worker_->holding_the_queue();
    int expected = kWaiting;
    return !phase->compare_exchange_strong(expected, kCalledOff);  // false: called off now
  };
  try {
    worker_->run_and_wait("finish (stats)", guarded, kEndDrainBound, started_or_call_off);
  } catch (const std::exception&) {
    if (phase->load() != kCalledOff || !worker_->broken().empty()) throw;  // its own error
    end_called_off_ = true;
    log_.warn("group '", getGroupUid(), "': ",
              at == FinishAt::kExit ? "the process exits" : "the group ends", " while ",
              holding.empty() ? std::string("an earlier operation") : holding,
              ", after waiting ", kEndDrainBound.count(),
              " ms for it (a peer may be stopped or gone), not the group's timeout: this group's "
              "stats (COMPCOLL_STATS_FILE) ",
              at == FinishAt::kExit
                  ? "and error-feedback state (COMPCOLL_STATE_DIR) are not written"
                  : "are not written, and its error-feedback state (COMPCOLL_STATE_DIR) is saved "
                    "only if that operation completes, when the group is released");
  }
}

std::string CompcollBackend::stats_json() {
  auto out = std::make_shared<std::string>();
  worker_->run_and_wait("stats", [out, host = host_, device = device_,
                                  g = group_stats_skeleton()]() mutable {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      LaneStats x;
      if (lane != nullptr && read_lane_stats(*lane, &x)) g.lanes.push_back(x);
    }
    *out = group_stats_json(g);
  });
  return *out;
}

size_t CompcollBackend::state_entries() {
  auto n = std::make_shared<size_t>(0);
  worker_->run_and_wait("state_entries", [n, host = host_, device = device_] {
    for (const std::shared_ptr<Lane>& lane : {host, device}) {
      if (lane != nullptr && lane->comm() != nullptr) *n += lane->comm()->state_entries();
    }
  });
  return *n;
}

const std::shared_ptr<Lane>& CompcollBackend::lane_named(const std::string& name) const {
  if (name == host_->name()) return host_;
  if (device_ && name == device_->name()) return device_;
  CC_THROW(kInvalidArgument, "this compcoll backend has no lane '", name, "' (it has '",
           host_->name(), "'", device_ ? ", '" + device_->name() + "'" : "", ")");
}

const std::shared_ptr<Lane>& CompcollBackend::lane_for(c10::Device device) const {
  if (device_ && device.type() == device_->type()) return device_;
  return host_;
}

c10::intrusive_ptr<c10d::Backend> CompcollBackend::inner_of(const std::string& lane) const {
  return lane_named(lane)->built_inner();
}

std::vector<SlotInfo> CompcollBackend::slots(const std::string& lane) {
  const std::shared_ptr<Lane>& l = lane_named(lane);
  return worker_->locked([&] { return l->slots.slots(); });
}

size_t CompcollBackend::slot_shapes_tracked(const std::string& lane) {
  const std::shared_ptr<Lane>& l = lane_named(lane);
  return worker_->locked([&] { return l->slots.shapes_tracked(); });
}

std::vector<BufferSlots::TraceEntry> CompcollBackend::key_trace(const std::string& lane) {
  const std::shared_ptr<Lane>& l = lane_named(lane);
  return worker_->locked([&] {
    return std::vector<BufferSlots::TraceEntry>(l->slots.trace().begin(), l->slots.trace().end());
  });
}

bool CompcollBackend::is_candidate(const Lane& lane, const std::vector<at::Tensor>& tensors,
                                   const c10d::AllreduceOptions& opts, DType* dtype,
                                   ReduceOp* op) const {
  if (tensors.size() != 1 || opts.sparseIndices.has_value()) return false;
  const at::Tensor& t = tensors[0];
  if (t.device().type() != lane.type() || t.layout() != at::kStrided || !t.is_contiguous()) {
    return false;
  }
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

c10::intrusive_ptr<c10d::Work> CompcollBackend::allreduce(std::vector<at::Tensor>& caller_tensors,
                                                          const c10d::AllreduceOptions& opts) {
  DeferredRelease::release_unshared();  // here, on the caller's thread
  // What the worker and the inner backend hold: aliases (python_free.h).
  std::vector<at::Tensor> tensors = python_free(caller_tensors);
  const c10::Device device = device_of(tensors);
  const std::shared_ptr<Lane>& lane = lane_for(device);
  DType dtype;
  ReduceOp op;
  using Where = UncompressedNotes::GradientsCompressed;
  // Where gradients were compressed before (in backward): beside them, an
  // exact allreduce outside backward is values (model averaging, metrics).
  const auto gradients_compressed = [this] {
    return compressible_candidates_.load() > 0 ? Where::kInThisGroup
           : compressible_candidates_in_process() > 0 ? Where::kInAnotherGroup
                                                      : Where::kNowhere;
  };
  if (!is_candidate(*lane, tensors, opts, &dtype, &op)) {
    if (cfg_.compression_enabled() && getRank() == 0) {  // once per group
      std::string note =
          uncompressed_notes_.first_report(tensors, opts.reduceOp, cfg_.min_elems, lane->type(),
                                           lane->type() == c10::DeviceType::CUDA ? "NCCL" : "Gloo");
      // Outside backward under the default scope the call is exact in any
      // case: advice about its dtype or layout alone would change nothing.
      const bool outside = !cfg_.torch_scope_all && !issued_in_backward();
      if (!note.empty() && outside && gradients_compressed() != Where::kNowhere) {
        log_.info("group '", getGroupUid(), "': ", note, ". Issued outside a backward pass "
                  "beside compressed gradients, it is taken as values, which "
                  "COMPCOLL_TORCH_SCOPE=backward keeps exact in any case");
      } else if (!note.empty() && outside) {
        log_.warn("group '", getGroupUid(), "': ", note, ". It was also issued outside a "
                  "backward pass, which COMPCOLL_TORCH_SCOPE=backward keeps exact too: if it "
                  "is a gradient sum, issue it in compcoll.gradient_scope() or set "
                  "COMPCOLL_TORCH_SCOPE=all as well");
      } else if (!note.empty()) {
        log_.warn("group '", getGroupUid(), "': ", note);
      }
    }
    return delegate(device, c10d::OpType::ALLREDUCE, "compcoll:all_reduce", tensors,
                    [tensors, opts](c10d::Backend& in) mutable {
                      return in.allreduce(tensors, opts);
                    }, opts.timeout);
  }
  at::Tensor t = tensors[0];
  bool compress = cfg_.compression_enabled() && static_cast<size_t>(t.numel()) >= cfg_.min_elems;
  // Set when the call takes the exact dense route whatever the algorithm.
  const char* exact_reason = nullptr;
  // Rank 0 says an exact route that is right once, at INFO; make_note()
  // returns "" after the first time (UncompressedNotes).
  const auto say_once_at_info = [this](const auto& make_note) {
    if (getRank() != 0) return;
    const std::string note = make_note();
    if (!note.empty()) log_.info("group '", getGroupUid(), "': ", note);
  };
  if (compress && owner_compresses_itself(current_owner())) {
    // PowerSGD's factors, or its plain allreduces: said once at
    // registration (compcoll/_ddp_hooks.py), exact here under every scope.
    compress = false;
    exact_reason = kSelfCompressingHook;
  } else if (compress && values_kind() == ValuesKind::kRecomputation) {
    // compcoll/_activation_checkpoint.py: activations recomputed in backward, exact
    // as in the forward they repeat; said once at INFO, since it is right.
    compress = false;
    exact_reason = kActivationsInBackward;
    say_once_at_info([&] {
      return uncompressed_notes_.first_activations(
          t.numel(), opts.reduceOp, "in activation checkpointing's recomputation of a forward");
    });
  } else if (compress && in_values_scope()) {
    compress = false;  // compcoll/_sync_batchnorm.py
    exact_reason = kBatchStatistics;
  } else if (compress && tensor_parallel()) {
    // Activations or their gradients: exact under every scope, and said
    // once at INFO, since it is right (mark_tensor_parallel).
    compress = false;
    exact_reason = kTensorParallel;
    say_once_at_info(
        [&] { return uncompressed_notes_.first_tensor_parallel(t.numel(), opts.reduceOp); });
  } else if (const std::string node = compress && !cfg_.torch_scope_all && issued_in_backward()
                                            ? activations_node() : std::string();
             !node.empty()) {
    // Activations or their gradients, in backward: exact, said once at
    // INFO, since it is right (issue_scope.h).
    compress = false;
    exact_reason = kActivationsInBackward;
    say_once_at_info([&] {
      return uncompressed_notes_.first_activations(t.numel(), opts.reduceOp,
                                                   "while autograd evaluated " + node);
    });
  } else if (compress && !cfg_.torch_scope_all && !issued_in_backward()) {
    // Maybe values, not gradients: exact, and said once (issue_scope.h).
    compress = false;
    exact_reason = kOutsideBackward;
    if (getRank() == 0) {
      // A warning only where no gradient was compressed before, in this
      // group or another of the process: beside DDP's compressed buckets,
      // an allreduce outside backward is values (model averaging, also over
      // subgroups that carry no gradients), and exact is right.
      const Where where = gradients_compressed();
      const std::string note =
          uncompressed_notes_.first_outside_backward(t.numel(), opts.reduceOp, where);
      if (!note.empty() && where != Where::kNowhere) {
        log_.info("group '", getGroupUid(), "': ", note);
      } else if (!note.empty()) {
        log_.warn("group '", getGroupUid(), "': ", note);
      }
    }
  }
  if (compress) compressible_candidates_.fetch_add(1);
  if (lane->staged() && !compress) {
    // Kept dense by the policy: the inner backend's own allreduce (exact,
    // AVG included), without the two staging copies. Counted.
    lane->count_direct(
        ring_allreduce_bytes(static_cast<size_t>(t.numel()) * dtype_size(dtype), getSize()));
    return delegate(device, c10d::OpType::ALLREDUCE, "compcoll:all_reduce", tensors,
                    [tensors, opts](c10d::Backend& in) mutable {
                      return in.allreduce(tensors, opts);
                    }, opts.timeout);
  }
  at::Tensor host;
  if (lane->staged()) {
    lane->inner();  // built on the first operation, on this thread (it may take the GIL)
    worker_->locked([&] {
      CC_CHECK(!lane->device || *lane->device == t.device(), kInvalidArgument, "rank ", getRank(),
               ": the compcoll ", lane->name(), " communicator of this process group works on ",
               lane->device->str(), "; an allreduce of a tensor on ", t.device().str(),
               " cannot join it (use one device per rank: torch.cuda.set_device)");
    });
    // The snapshot, now: the caller's current stream has finished with t
    // when it returns. Not under the queue lock (it waits for the device).
    host = stage_to_host(t);
  }
  auto work = c10::make_intrusive<CompcollWork>(getRank(), c10d::OpType::ALLREDUCE,
                                                "compcoll:all_reduce", tensors);
  if (timing_) work->time_from_now();
  const std::string what = op_label("all_reduce", tensors);
  // Its own timeout, if its options give one (group_timeout.h), else the
  // group's now: the worker's deadline and, as the worker runs it under
  // that timeout, every wait of the algorithm.
  const std::chrono::milliseconds op_timeout = timeout_->for_operation(opts.timeout);
  worker_->submit(what, work, [&]() -> Worker::Task {
    if (lane->staged() && !lane->device) lane->device = t.device();
    // Keys are assigned in submission order, on the caller's thread, while
    // the tensor is certainly alive. Tensors the policy keeps dense (the
    // algorithm is dense, or fewer than COMPCOLL_MIN_ELEMS elements) need
    // no state and get no slot.
    SlotAssignment a{"", SlotEvent::kSame, 0};
    std::string order_key;
    if (compress) {
      a = lane->slots.assign(t, backward_pass(), current_owner());
      order_key = lane->handover_order_key(t, backward_pass(), current_owner(),
                                           a.event != SlotEvent::kSame);
    }
    if (compress) ++compressed_submissions_;
    if (compress && count_step_calls_) {  // check_one_allreduce_per_step
      ++step_calls_;
      step_keys_.insert(lane->name() + "/" + a.key);
    }
    log_slot_event(*lane, a, t.numel());
    return [lane, cfg = lane_cfg_, timeout = timeout_, work, t, host, dtype, op,
            key = a.key, order_key = std::move(order_key), dropped = a.dropped_key,
            merged = a.merged_key, exact_reason,
            board = board_, context = detail::concat("rank ", getRank(), "/", getSize(), ", group '",
                                     getGroupUid(), "': ", what)] {
      run_candidate(lane, cfg, timeout, work, t, host, dtype, op, key, order_key, dropped, merged,
                    context, exact_reason, board);
    };
  }, op_timeout);
  return work;
}

void CompcollBackend::mark_tensor_parallel() {
  if (tensor_parallel_.exchange(true)) return;
  const uint64_t compressed = compressible_candidates_.load();
  if (compressed == 0 || getRank() != 0) return;
  log_.warn("group '", getGroupUid(), "': marked as carrying tensor parallelism after ",
            compressed, " compressed allreduces (a DTensor parallel style applied on it, a "
            "Partial placement reduced over it, or compcoll.mark_tensor_parallel): from now on "
            "every allreduce of this group takes the exact dense path. If they are "
            "data-parallel gradient sums (DDP on the group of a DTensor computation), give "
            "DTensor a mesh over another group (docs/pytorch.md, \"Which allreduces are "
            "compressed\")");
}

void CompcollBackend::log_slot_event(const Lane& lane, const SlotAssignment& a, int64_t numel) {
  if (!a.merged_key.empty() && getRank() == 0) {
    // The pattern is handled, so INFO: said once per shape, by rank 0.
    log_.info("error-feedback state ", a.key, " (", lane.name(), ", ", numel,
              " elements): every call reduces a newly allocated tensor while the previous one is "
              "still alive (e.g. a DDP comm hook that allreduces a fresh tensor and returns it); "
              "its calls had alternated between two states, now merged into one (", a.merged_key,
              " into ", a.key, "), which every new tensor of this shape continues");
  }
  if (a.event != SlotEvent::kFresh && a.event != SlotEvent::kResized) {
    if (a.event != SlotEvent::kSame) {
      log_.trace("error-feedback state ", a.key, " for ", numel, " elements: ",
                 slot_event_name(a.event));
    }
    return;
  }
  // Expected: DDP's bucket rebuild does this once per bucket (its buckets
  // change layout after iteration 1), and so does every new DDP model on
  // the group. Nothing to act on, so INFO (issue 12); a drop is never
  // silent at that level.
  const std::string why =
      a.event == SlotEvent::kResized ? " (different size or dtype)"
      : a.lasting_uses > 0
          ? detail::concat(" (the freed buffer served ", a.lasting_uses,
                           " calls: a lasting tensor that is gone, and the new buffer another "
                           "one, as when a new DDP model follows a freed one)")
          : std::string(" (first replacement of this slot: DDP's bucket rebuild, whose layout may "
                        "differ, or a comm hook's fresh tensor each step, whose slots are merged "
                        "once that pattern repeats, buffer_slots.h)");
  log_.info("error-feedback state ", a.key, " (", lane.name(), "): a new buffer of ", numel,
            " elements replaced a freed one; the freed buffer's residual (", a.dropped_elems,
            " elements) is dropped", why);
}

void CompcollBackend::addEphemeralTimeout(const std::chrono::milliseconds& timeout) {
  worker_->add_ephemeral_timeout(timeout);
  // The inner backends extend their own waits (a delegated operation's):
  // those built now; a device lane built later starts without it.
  for (const c10::intrusive_ptr<c10d::Backend>& b : built_inners()) b->addEphemeralTimeout(timeout);
  log_.info("group '", getGroupUid(), "': timeout extended by ", timeout.count(),
            " ms until the next operation completes (addEphemeralTimeout)");
}

void CompcollBackend::enableCollectivesTiming() {
  // The inner backends first: one that cannot time refuses here, before
  // compcoll says it is on.
  for (const c10::intrusive_ptr<c10d::Backend>& b : built_inners()) b->enableCollectivesTiming();
  timing_ = true;
}

void CompcollBackend::setTimeout(std::chrono::milliseconds timeout) {
  // torch.distributed.set_timeout(): "for all future operations". compcoll's
  // own waits (the worker's deadlines, the compressed algorithms' waits on
  // the inner backend) read the shared value at submission; the inner
  // backends (a device lane's when it is built) get it too.
  const std::chrono::milliseconds before = timeout_->group();
  // Refuses a timeout <= 0 and keeps the old one. The worker's watchdog
  // needs no nudge: the first operation submitted after a shortening wakes
  // it when its deadline falls before the watchdog's next wake-up.
  timeout_->set(timeout);
  host_->set_timeout(timeout);
  if (device_) device_->set_timeout(timeout);
  log_.info("group '", getGroupUid(), "': timeout ", before.count(), " -> ", timeout.count(),
            " ms, for the operations submitted from now on");
}

void CompcollBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  worker_->set_group(pg_uid);
  host_->set_group_uid(pg_uid);
  if (device_) device_->set_group_uid(pg_uid);
}

#if COMPCOLL_TORCH_VIRTUAL_BOUND_DEVICE
void CompcollBackend::setBoundDeviceId(std::optional<at::Device> device) {
  c10d::Backend::setBoundDeviceId(device);
  host_->set_bound_device(device);
  if (device_) device_->set_bound_device(device);
}
#endif

c10::intrusive_ptr<c10d::Backend> CompcollBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  TORCH_CHECK(child_factory_, "compcoll: group '", getGroupUid(),
              "' was created without a way to split it (split_group)");
  TORCH_CHECK(opts, "compcoll: split_group gave no options for the child group");
  auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return {};
  return child_factory_(store, static_cast<int>(me - ranks.begin()),
                        static_cast<int>(ranks.size()), opts->timeout, opts->group_name);
}

c10::intrusive_ptr<c10d::Backend> CompcollBackend::merge(
    const c10::intrusive_ptr<c10d::Store>& store, const c10::intrusive_ptr<Options>& opts,
    const int& rank, const int& size) {
  TORCH_CHECK(child_factory_, "compcoll: group '", getGroupUid(),
              "' was created without a way to merge it (merge_remote_group)");
  TORCH_CHECK(opts, "compcoll: merge_remote_group gave no options for the merged group");
  return child_factory_(store, rank, size, opts->timeout, opts->group_name);
}

void CompcollBackend::eagerConnectSingleDevice(at::Device device) {
  // An explicit request: builds the device lane's inner backend now.
  lane_for(device)->inner()->eagerConnectSingleDevice(device);
}

c10d::ErrorType CompcollBackend::getError() {
  if (!worker_->broken().empty()) return c10d::ErrorType::TIMEOUT;
  for (const c10::intrusive_ptr<c10d::Backend>& b : built_inners()) {
    const c10d::ErrorType e = b->getError();
    if (e != c10d::ErrorType::SUCCESS) return e;
  }
  return c10d::ErrorType::SUCCESS;
}

std::vector<c10::intrusive_ptr<c10d::Backend>> CompcollBackend::built_inners() const {
  std::vector<c10::intrusive_ptr<c10d::Backend>> out{inner_};
  if (device_) {
    if (c10::intrusive_ptr<c10d::Backend> d = device_->built_inner()) out.push_back(std::move(d));
  }
  return out;
}

void CompcollBackend::abort() {
  for (const c10::intrusive_ptr<c10d::Backend>& b : built_inners()) b->abort();
}

void CompcollBackend::shutdown() {
  if (board_) board_->close();  // operations failing from here on post nothing
  try {
    finish(FinishAt::kGroupEnd);
  } catch (const std::exception& e) {
    log_.warn("finishing the torch backend at shutdown failed: ", e.what());
  }
  for (const c10::intrusive_ptr<c10d::Backend>& b : built_inners()) b->shutdown();
}

}  // namespace compcoll::torch_integration
