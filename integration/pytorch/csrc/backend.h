// CompcollBackend: a c10d backend ("compcoll", devices cpu and cuda) that
// wraps inner torch backends and compresses eligible allreduces with
// compcoll. torch registers one backend object for every device of the
// group, so this one object serves both kinds of tensor, each through a
// lane (lane.h):
//
//   host lane    cpu tensors, over the inner Gloo backend.
//   device lane  cuda tensors, over an inner NCCL backend built on first use
//                (only when the creator was given its factory: CUDA and NCCL
//                available, group created as "compcoll"). Without a device
//                lane, cuda tensors go to the inner Gloo, uncompressed.
//
//   candidate   an allreduce of one dense, contiguous tensor of float32,
//               float16 or bfloat16 with SUM or AVG, on its lane's device
//               type. Candidates go to the lane's Communicator, whose policy
//               compresses those of at least COMPCOLL_MIN_ELEMS elements
//               issued during a backward pass (COMPCOLL_TORCH_SCOPE,
//               issue_scope.h) and sends the rest through the exact dense
//               path (so the stats count every gradient call). On the device lane a candidate
//               to compress is host-staged: copied to host memory at
//               submission, on the caller's thread and current stream (so
//               whatever that stream did to the tensor before the call is in
//               the copy); the CPU codecs run on the worker; payloads travel
//               over NCCL through staging tensors on the device; the result
//               is copied back (synchronously, on the worker's own stream)
//               before the work completes. A device candidate the policy
//               keeps dense is delegated to NCCL's allreduce as it is (no
//               staging) and counted as a direct call in the stats.
//   delegated   everything else (other dtypes and ops, sparse tensors,
//               broadcast, allgather, reduce_scatter, alltoall, send/recv,
//               barrier, ...): the same call on the lane's inner backend.
//   worker      one thread per backend (worker.h) runs candidates (and the
//               operations queued behind them) in submission order, whatever
//               their lane. Gloo and NCCL match operations by the order in
//               which they are issued, and every rank submits in the same
//               order, so issuing every inner operation in submission order
//               keeps each inner backend in lockstep across ranks (one queue
//               for both lanes: each inner backend sees its operations in
//               submission order, and a lane's Communicator is made by the
//               worker at its first candidate, at the same point of that
//               order on every rank). A delegated operation is issued
//               directly by the caller when the worker is idle and nothing is
//               queued (under the queue lock), else queued. An operation
//               submitted from a future callback that the worker is running
//               (DDP comm hooks: PowerSGD) runs at once on the worker, right
//               after the operation that completed (worker.h, "Callbacks").
//               Every queued operation settles by its deadline (submission +
//               the group's timeout) or fails with a compcoll error naming it
//               and the group; the group is then unusable (worker.h,
//               "Deadlines"). A queued operation on device tensors records
//               an event on the caller's current stream at submission; the
//               worker makes its own stream wait for it, issues the
//               operation with that stream current, waits for the inner work
//               and synchronises the stream before completing.
//   work        candidates and queued operations return a CompcollWork whose
//               future completes on the worker (or on Gloo's thread) with the
//               output tensors, or with the compcoll error; wait() rethrows.
//   keys        error-feedback state keys come from each lane's BufferSlots
//               (see buffer_slots.h): buffer identity, robust to DDP's
//               rebuild.
//
// FSDP: reduce-scatter is delegated, never compressed. A group that has
// delegated reduce-scatters of at least COMPCOLL_MIN_ELEMS elements while
// no allreduce of it could be compressed says so once, on group rank 0, at
// its second such reduce-scatter (or at finish() if there is no second):
// at WARN when no compcoll group of the process has compressed an allreduce
// either (FSDP FULL_SHARD, fully_shard on a 1-D mesh: nothing is saved), at
// INFO when another group has (HYBRID_SHARD, fully_shard on a 2-D mesh: the
// allreduce across replicas that follows each reduce-scatter is compressed;
// by the second reduce-scatter the first one's allreduce has been submitted).
//
// split_group, merge_remote_group: torch builds such a group by asking the
// parent's backend for the child's. The child is built the way the parent
// was (its creator's child factory, from Python): a compcoll backend over a
// Gloo group of the child's ranks, with the parent's device lane and its own
// error-feedback state. Without a child factory the backend says it cannot
// split, as torch expects.
//
// finish() (called at destruction and, from Python, at interpreter exit)
// drains the queue, finishes the lanes' Communicators and records the
// group's counters in the process's COMPCOLL_STATS_FILE (group_stats.h:
// one file per process, every group under its name, totals at the top).
#pragma once

// setup.py probes torch's headers and defines these (0 or 1).
#if !defined(COMPCOLL_TORCH_VIRTUAL_BOUND_DEVICE) || !defined(COMPCOLL_TORCH_COALESCED_OPTYPES)
#error "build the extension through setup.py, which defines COMPCOLL_TORCH_* from torch's headers"
#endif

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <set>
#include <memory>
#include <string>
#include <vector>
#include <unistd.h>  // getpid

#include "integration/pytorch/csrc/buffer_slots.h"
#include "integration/pytorch/csrc/failure_board.h"
#include "integration/pytorch/csrc/group_stats.h"
#include "integration/pytorch/csrc/group_timeout.h"
#include "integration/pytorch/csrc/lane.h"
#include "integration/pytorch/csrc/uncompressed_notes.h"
#include "integration/pytorch/csrc/work.h"
#include "integration/pytorch/csrc/worker.h"
#include "plugin/communicator.h"
#include "plugin/config.h"
#include "plugin/logging.h"

namespace compcoll::torch_integration {

// The device lane a backend gets: the device type it serves, the lane's
// name (stats, queries) and the factory of its inner backend. No factory:
// no device lane.
struct DeviceLaneSpec {
  c10::DeviceType type = c10::DeviceType::CUDA;
  std::string name;
  Lane::Factory factory;
};

// Who the process is in COMPCOLL_STATS_FILE: its global rank (the file's
// {rank}) and the world size. rank < 0: the group's own.
struct StatsIdentity {
  int rank = -1;
  int world_size = -1;
};

// Builds a child group's backend (see split_group above) on the store torch
// gives it, as rank `rank` of `size`, with its timeout and name.
using ChildFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& group_name)>;

class CompcollBackend final : public c10d::Backend {
 public:
  // Collective over inner: reads the COMPCOLL_* configuration (rank and size
  // are inner's) and builds the host lane's Communicator, which agrees on
  // it. timeout: the process group's timeout; every inner wait honours it,
  // and every queued operation settles within it (setTimeout() changes it
  // for the operations submitted after). state_tag: names the group's
  // COMPCOLL_STATE_DIR files ("" for the default group; see _backend.py).
  // store: the group's, for its failure board (failure_board.h: a failed
  // operation's error names the ranks that are gone or stuck); none: errors
  // name no peer.
  // log_group: the group its communicators' log lines name beside their
  // rank ("" for the default group, whose ranks are the job's).
  CompcollBackend(c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout,
                  DeviceLaneSpec device_lane = {}, StatsIdentity stats_id = {},
                  std::string state_tag = {}, std::string log_group = {},
                  c10::intrusive_ptr<c10d::Store> store = {});
  ~CompcollBackend() override;

  const std::string getBackendName() const override { return "compcoll"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return inner_->getBackendOptions(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Ephemeral timeout extensions (torch.compile's long compiles): compcoll's
  // deadlines take them as the inner backends do (Worker).
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout) override;
  // Collective timing: the inner backends' works and compcoll's own.
  void enableCollectivesTiming() override;
  void setGroupUid(const std::string& pg_uid) override;
#if COMPCOLL_TORCH_VIRTUAL_BOUND_DEVICE
  // Forwarded to the inner groups. Older torch (setup.py probes the headers)
  // has no virtual to override: the inner groups then bind lazily, as they
  // would with no device_id given.
  void setBoundDeviceId(std::optional<at::Device> device) override;
#endif
  void eagerConnectSingleDevice(at::Device device) override;
  bool supportsSplitting() const override { return static_cast<bool>(child_factory_); }
  // ranks: the parent's group ranks that form the child; null on a rank that
  // is not among them.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts,
                                          const int& rank, const int& size) override;
  // Set once, by the creator, before the backend is handed to torch.
  void set_child_factory(ChildFactory factory) { child_factory_ = std::move(factory); }
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;

  // compcoll's own surface (Python: compcoll._C).
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  // The inner backend of the lane named lane ("cpu", "cuda"), null while it
  // has not been built; never builds it.
  c10::intrusive_ptr<c10d::Backend> inner_of(const std::string& lane) const;
  // The device lane's name, or "" without one.
  std::string device_lane() const { return device_ ? device_->name() : std::string(); }
  const Config& config() const { return cfg_; }
  // The group carries tensor parallelism (compcoll._tensor_parallel marks it
  // when a DTensor parallel style is applied on it or DTensor reduces on
  // it, or the script calls compcoll.mark_tensor_parallel): its allreduces sum activations or their gradients, one batch's
  // values, so every one takes the exact route, in backward too and under
  // either COMPCOLL_TORCH_SCOPE (a residual carried into the next batch
  // would corrupt both). A mark on the group, not on the call, holds for
  // the collectives a compiled graph issues as well. Every rank marks it at
  // the same point of the program (the style's application, or the first
  // such reduction, or the script's compcoll.mark_tensor_parallel), so they
  // route its calls alike. A group marked after it compressed is said at
  // WARN: a data-parallel group, whose compression ends there.
  void mark_tensor_parallel();
  bool tensor_parallel() const { return tensor_parallel_.load(); }
  // Drains the queue and records the stats (group_stats.h) and, with
  // COMPCOLL_STATE_DIR, the error-feedback state; idempotent. When the
  // group or the process ends (not at the script's compcoll.finish), the
  // recording waits at most kEndDrainBound to start behind what holds the
  // worker, rather than the group's timeout (plain Gloo waits for nothing
  // there): past it, the recording is called off and a WARN names what held
  // the worker and what is not written.
  enum class FinishAt { kRequest, kGroupEnd, kExit };
  void finish(FinishAt at = FinishAt::kRequest);
  // How long the end of a group or of the process waits for the worker.
  static constexpr std::chrono::milliseconds kEndDrainBound{5000};
  // The process is exiting: the failure board posts and reads nothing more
  // (FailureBoard::close).
  void close_failure_board() {
    if (board_) board_->close();
  }
  // finish() has run (destroy_process_group, shutdown): no more calls.
  bool finished() const { return finished_.load(); }
  // The group's stats as JSON (group_stats_json), taken on the worker after
  // everything submitted so far.
  std::string stats_json();
  std::vector<SlotInfo> slots(const std::string& lane);
  std::vector<BufferSlots::TraceEntry> key_trace(const std::string& lane);
  size_t slot_shapes_tracked(const std::string& lane);
  // Error-feedback states held by every lane's Communicator.
  size_t state_entries();
  // Error-feedback checkpoints (checkpoint.cc), taken and restored on the
  // worker after everything submitted so far: each lane that has a
  // Communicator -> its Communicator::save_state() bytes; load_state gives
  // each named lane its bytes and says per lane whether they were used.
  std::map<std::string, Bytes> save_state();
  std::map<std::string, bool> load_state(const std::map<std::string, Bytes>& lanes);
  // The caller's loss scale went from S to factor * S (torch.amp.GradScaler,
  // compcoll/_loss_scale.py): every lane's error-feedback state is rescaled
  // (Communicator::rescale_state), on the worker after everything submitted
  // so far, so that the calls issued from now on find it in the new unit.
  // Returns how many states were rescaled.
  size_t rescale_state(double factor);
  // A torch.amp.GradScaler scales this process's losses (its first enabled
  // scale() call, compcoll/_loss_scale.py): from then on every group's
  // compressed calls whose result is not finite leave their state as it was
  // (Communicator::set_discard_nonfinite), since the scaler skips that step.
  static void note_loss_scaled();
  static bool loss_scaled();
  // COMPCOLL_MOMENTUM_HANDOVER=auto (optimizer_momentum.cc). Whether this
  // group still waits for the optimizer's momentum: the configuration takes
  // it and the group has not agreed on it yet.
  bool awaits_optimizer_momentum() const;
  // Collective over the group, on the worker after everything submitted so
  // far: every rank proposes the momentum of its optimizer (m 0: none that
  // can be taken over, `why` says which; moved: Adam's beta1, which the
  // caller sets to 0 once agreed), the group takes it when all proposals are
  // equal, and every lane's Communicator adopts it for its later calls.
  // Logs the outcome once (group rank 0). Returns the agreed momentum.
  // proposal nullopt: this rank abstains, shadowing under DDP's Join a step
  // its peers take (it has no optimizer stepping); the others decide, and
  // when none proposed, the group still awaits.
  OptimizerMomentum agree_optimizer_momentum(std::optional<OptimizerMomentum> proposal,
                                             const std::string& why);
  // What the group has taken (m 0: nothing, or turned off again).
  OptimizerMomentum optimizer_momentum() const;
  // A momentum correction set in the configuration (COMPCOLL_MOMENTUM > 0)
  // that applies to what this group has compressed so far, with whether it
  // is handed over (COMPCOLL_MOMENTUM_HANDOVER=1), else nullopt. Python
  // checks it against the optimizer once (compcoll/_momentum.py): the
  // momentum applied twice, or handed to an optimizer that does not run it,
  // is otherwise silent.
  std::optional<std::pair<float, bool>> configured_momentum() const;  // (m, handed over)
  // At every optimizer step after the agreement, until it has decided: the
  // hand-over needs exactly one allreduce of each gradient buffer per
  // optimizer step (DDP; no_sync() accumulation). Over one whole step it
  // counts the compressed allreduces and their distinct buffers; where any
  // rank saw more calls than buffers (accumulation without no_sync, a
  // gradient reduced twice), the group agrees to turn the hand-over off
  // again and warns. Collective over the group at that one step.
  // counted false: a step shadowed under DDP's Join, whose calls say nothing.
  void check_one_allreduce_per_step(bool counted = true);

  // Builds a backend (collective, see the constructor) and records it for
  // live().
  static c10::intrusive_ptr<CompcollBackend> create(c10::intrusive_ptr<c10d::Backend> inner,
                                                    std::chrono::milliseconds timeout,
                                                    DeviceLaneSpec device_lane = {},
                                                    StatsIdentity stats_id = {},
                                                    std::string state_tag = {},
                                                    std::string log_group = {},
                                                    c10::intrusive_ptr<c10d::Store> store = {});
  // Every live backend of this process (for the exit hook).
  static std::vector<c10::intrusive_ptr<CompcollBackend>> live();

 private:
  // Issues issue(inner) on the lane serving device, in submission order.
  // requested: the operation's own timeout from its options (c10d's
  // kUnsetTimeout: the group's), which bounds compcoll's waits for it as
  // the inner backend's. collective: false for point-to-point operations
  // (matched by peer and tag, not by order).
  // (delegated_ops.cc, beside the operations it serves.)
  using Issue = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend& inner)>;
  c10::intrusive_ptr<c10d::Work> delegate(c10::Device device, c10d::OpType type,
                                          const char* title, std::vector<at::Tensor> outputs,
                                          Issue issue, std::chrono::milliseconds requested,
                                          bool collective = true);
  const std::shared_ptr<Lane>& lane_for(c10::Device device) const;
  // The inner backends built so far: the host lane's, and the device lane's
  // once its first operation built it (abort, shutdown, timeouts, timing).
  std::vector<c10::intrusive_ptr<c10d::Backend>> built_inners() const;
  const std::shared_ptr<Lane>& lane_named(const std::string& name) const;
  bool is_candidate(const Lane& lane, const std::vector<at::Tensor>& tensors,
                    const c10d::AllreduceOptions& opts, DType* dtype, ReduceOp* op) const;
  // Reports a dropped residual, and merged states (under the queue lock).
  void log_slot_event(const Lane& lane, const SlotAssignment& a, int64_t numel);
  // Counts a delegated reduce-scatter of elems input elements; the FSDP
  // note (see the top of this file), which report_reduce_scatters() says.
  void note_reduce_scatter(int64_t elems);
  void report_reduce_scatters();
  // Allreduces that every live compcoll backend of the process could compress.
  static uint64_t compressible_candidates_in_process();
  // The group's stats without the lanes' (read on the worker).
  GroupStats group_stats_skeleton() const;

  c10::intrusive_ptr<c10d::Backend> inner_;  // the host lane's (Gloo)
  // The group's timeout, shared with the worker and the lanes' TorchComms
  // so that setTimeout() reaches every wait (group_timeout.h).
  std::shared_ptr<GroupTimeout> timeout_;
  std::atomic<bool> timing_{false};  // enableCollectivesTiming
  std::atomic<bool> tensor_parallel_{false};  // mark_tensor_parallel
  Config cfg_;
  // cfg_ for the lanes' Communicators (no stats file: the backend writes
  // it), shared with the worker's tasks.
  std::shared_ptr<const Config> lane_cfg_;
  Logger log_;
  StatsIdentity stats_id_;
  // Shared with the worker's tasks, which may outlive the backend (worker.h).
  std::shared_ptr<Lane> host_;
  std::shared_ptr<Lane> device_;  // null without a device lane
  std::shared_ptr<Worker> worker_;
  // Shared with the worker and the tasks; null without a store.
  std::shared_ptr<FailureBoard> board_;

  std::atomic<bool> finished_{false};
  // finish() at a group's end or exit waited kEndDrainBound for a held
  // worker and called its task off (the destructor then waits no more).
  std::atomic<bool> end_called_off_{false};
  const pid_t created_by_ = getpid();  // live() lists this process's backends only
  std::atomic<bool> momentum_agreed_{false};
  // One atomic: m and its kind are read together (stats, the Python hook).
  std::atomic<OptimizerMomentum> optimizer_momentum_{OptimizerMomentum{}};
  // optimizer_momentum.cc: serialises the Python thread(s) stepping optimizers.
  std::mutex momentum_mu_;
  int momentum_check_stage_ = 0;  // 0: next step starts counting; 1: counting; 2: decided
  // compressed_submissions_ when the stage last moved (or the group agreed):
  // a step moves it only after compressed calls were submitted since, so
  // several optimizers stepped one after another count as one step, on a
  // rank that shadows its peers' steps under DDP's Join as on the peers.
  uint64_t submissions_at_stage_ = 0;
  // Guarded by the worker's queue lock: the count over one optimizer step,
  // and every compressed call submitted.
  bool count_step_calls_ = false;
  uint64_t step_calls_ = 0;
  std::set<std::string> step_keys_;
  uint64_t compressed_submissions_ = 0;
  std::atomic<uint64_t> compressible_candidates_{0};
  std::atomic<uint64_t> rs_calls_{0};
  std::atomic<uint64_t> rs_elems_{0};
  // Reduce-scatters of at least COMPCOLL_MIN_ELEMS with compression on, and
  // the largest of them (elements).
  std::atomic<uint64_t> rs_eligible_{0};
  std::atomic<int64_t> rs_largest_{0};
  std::atomic<bool> rs_warned_{false};
  // Loss-scale changes that rescaled this group's state (rescale_state).
  std::atomic<uint64_t> loss_scale_changes_{0};
  UncompressedNotes uncompressed_notes_;  // float64, non-contiguous, ...: said once
  ChildFactory child_factory_;  // empty: the backend cannot split or merge
};

}  // namespace compcoll::torch_integration
