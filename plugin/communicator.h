// A compcoll communicator: what a C/C++ program (through compcoll.h), the
// benchmark and the integrations hold. It owns the transport (a Comm), the
// configured algorithm, the per-tensor error-feedback state, the stats and
// the logger, and routes each allreduce call:
//
//   policy    compressed when the algorithm is not dense, the dtype is
//             float32/fp16/bf16, the op SUM/AVG and count >= min_elems;
//             otherwise the exact dense path. Each new decision per tensor
//             key is logged at INFO.
//   state     looked up by the caller's key, else (address, count, dtype).
//   errors    any failure marks the communicator broken: later calls throw,
//             saying it must be rebuilt.
//   hierarchy with COMPCOLL_HIERARCHY (host, or auto when some host has
//             several ranks, there are several hosts and some machine's
//             ranks outnumber its CPUs), compressed calls
//             take the host hierarchy (collectives/hierarchical.h): a dense
//             sum over shared memory inside each host, the algorithm between
//             one leader per host, the result shared back. Error-feedback
//             state then lives on the leaders only. The dense route stays
//             flat (exact, the transport's own allreduce).
//
// Creating one is collective: every rank connects and then exchanges its
// effective configuration; a mismatch fails every rank before any data moves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "collectives/algorithm.h"
#include "collectives/momentum_handover.h"
#include "collectives/comm.h"
#include "collectives/device_route.h"
#include "collectives/dispatch.h"
#include "collectives/hierarchical.h"
#include "plugin/config.h"
#include "plugin/logging.h"
#include "plugin/state_file.h"
#include "plugin/state_store.h"
#include "plugin/stats.h"

namespace compcoll {

class Communicator {
 public:
  // Connects through cfg.rendezvous (Gloo tcp/ibverbs) as cfg.rank of
  // cfg.world_size, then agrees on the configuration.
  static std::unique_ptr<Communicator> connect(const Config& cfg);

  // Adopts an existing transport (tests, the PyTorch backend), then agrees.
  Communicator(std::unique_ptr<Comm> comm, const Config& cfg);
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // In-place allreduce. key may be null or empty (then address/count/dtype).
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op, const char* key = nullptr);
  // Compressed calls on device memory (the NCCL interposer's GPU codecs,
  // collectives/device_route.h). device_route_refusal: why this call cannot
  // take `device` ("" when it can): a dense route, the host hierarchy, the
  // momentum hand-over, an algorithm or pattern without a GPU route, a loss
  // scaler in charge (set_discard_nonfinite), or the route's own reason
  // (dtype, buffers not in device memory).
  // allreduce_device: recv = the allreduce of send (both device memory) on
  // that route, with this communicator's state, stats and logs; only for a
  // call device_route_refusal accepts (else kInternal).
  std::string device_route_refusal(const DeviceRoute& device, const void* send, const void* recv,
                                   size_t count, DType dtype, ReduceOp op) const;
  void allreduce_device(DeviceRoute& device, const void* send, void* recv, size_t count,
                        DType dtype, ReduceOp op, const char* key = nullptr);
  // The same on the exact dense route, whatever the algorithm (counted in the
  // stats as a dense call); reason says why, in the route's log line. The
  // PyTorch backend sends this way what it must not compress
  // (COMPCOLL_TORCH_SCOPE, tensor parallelism's activations); the WARN of a
  // communicator that compressed nothing counts these calls by reason.
  void allreduce_exact(void* buf, size_t count, DType dtype, ReduceOp op, const char* reason);

  // Frees the error-feedback state of an explicit key whose tensor is gone
  // (the PyTorch backend after DDP's bucket rebuild), instead of waiting for
  // eviction. Returns whether there was one.
  bool drop_state(const std::string& key);
  // Merges the error-feedback state of explicit key `from` into that of
  // `into` and frees from's (the PyTorch backend, when one tensor's calls
  // turn out to have been split between two keys: buffer_slots.h). Nothing
  // from's residual holds is lost, unless the sizes differ (then it is
  // dropped, and logged at INFO).
  void merge_state(const std::string& from, const std::string& into);

  // Takes the call slot for good unless a call is running (then false):
  // from now on every call is refused as one made during another. For the
  // C API's exit hook, which then finishes the communicator.
  bool enter_final_call() { return !in_call_.exchange(true); }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  const Config& config() const { return cfg_; }
  const Stats& stats() const { return stats_; }
  // The counters and the state's bytes as of the last finished call. Any
  // thread, while a call runs too (the C API's stats getters: a monitoring
  // thread must not read what the running call writes).
  struct StatsSnapshot {
    StatsCounters counters;
    size_t state_bytes = 0;
  };
  StatsSnapshot stats_snapshot() const;
  size_t state_entries() const { return states_.entries(); }
  // Every tensor's state, and the copy a loss-scaled call can be undone with.
  size_t state_bytes() const { return states_.memory_bytes() + undo_.memory_bytes(); }
  Comm& comm() { return *comm_; }
  // The host hierarchy compressed calls take; null when they run flat.
  const Hierarchy* hierarchy() const { return hier_.get(); }

  // Checkpoints of the error-feedback state (plugin/state_file.h); neither
  // of the first two is collective. save_state: this rank's entries under explicit keys
  // (address keys name memory of this process only, so they are left out,
  // and that is logged at INFO). load_state: replaces the store with the
  // checkpoint's entries when it was written by the same rank of a
  // communicator of the same size and configuration and every entry has the
  // shape this algorithm gives its tensor; otherwise keeps the store as it
  // was, says why (in *why_not when given, else at WARN: a checkpoint handed
  // over and not used is a resume that did not happen) and returns false.
  // Bytes that are not an intact state file throw kInvalidArgument.
  // Device-resident states (allreduce_device) come back to host memory first.
  Bytes save_state(size_t* saved_entries = nullptr);  // how many it holds, when asked
  bool load_state(std::span<const uint8_t> bytes, std::string* why_not = nullptr);
  // load_state as every rank of the communicator does it together
  // (collective: every rank calls it, with its bytes or nullopt when it has
  // none): the ranks restore together or none does, and the files must have
  // been saved at one point (the same clock). A restore on some ranks only
  // gives the same sums everywhere but, under a momentum hand-over, hands
  // each rank's optimizer another delta: the replicas drift apart. A rank
  // that cannot use its own file says why at WARN, one that could says that
  // another could not; an unreadable file throws on its rank after the
  // exchange. Returns whether this rank restored.
  bool load_state_agreed(std::optional<std::span<const uint8_t>> bytes);

  // The caller's gradients change unit from the next call on: a loss scale
  // went from S to factor * S (mixed precision; the PyTorch backend follows
  // torch.amp.GradScaler). Every error-feedback state is rescaled with it
  // (compression/state_scale.h), so that what it holds is sent in the unit
  // the caller will divide by. Not collective: each rank's state is its own.
  // Returns how many states were rescaled; factor must be finite and > 0.
  // Between calls: made while a call runs on another thread, it is refused
  // and touches nothing (as a second call is). A failed communicator refuses
  // it (kTransport), as it refuses an allreduce.
  size_t rescale_state(float factor);
  // Whether a call failed and every further one is refused: what a process's
  // fan-out over its communicators (the loss scaler's rescale) skips.
  bool broken() const { return !broken_.empty(); }

  // A loss scaler is in charge: a step whose reduced gradients hold a
  // non-finite value is skipped by the caller (torch.amp.GradScaler), as if
  // it had not happened. With this on, a compressed call whose result holds
  // a non-finite value leaves its error-feedback state exactly as it was
  // before the call (the result itself is delivered as usual, non-finite
  // values in place), so that nothing of the skipped step is sent later;
  // the result is the same on every rank, so every rank decides alike. It
  // costs a copy of the state per compressed call. The device route keeps
  // its state in device memory and cannot undo a call, so with this on it
  // refuses every call (device_route_refusal says why) and they run staged.
  // Between calls, as rescale_state.
  void set_discard_nonfinite(bool on);
  // The next call's key for the momentum hand-over's mirror, when the
  // caller knows the call's place in a sequence every rank issues alike
  // (the PyTorch backend: the k-th compressed call of its shape in a
  // backward pass). The mirror must be the same on every rank, and a
  // tensor's own key need not be: the PyTorch backend's keys follow buffers
  // (buffer_slots.h), and ranks may pair a fresh tensor with different
  // slots (a comm hook's fresh tensor, freed earlier on one rank than on
  // another), which would make the ranks hand over different momenta and
  // their replicas drift. Consumed by the next call; "" (the default): the
  // mirror is the tensor's own.
  void set_handover_order_key(std::string order_key) { handover_order_key_ = std::move(order_key); }
  uint64_t discarded_calls() const { return discarded_calls_; }

  // COMPCOLL_MOMENTUM_HANDOVER=auto: from the next call on, compressed
  // calls apply DGC's momentum correction with the caller's optimizer
  // momentum m and hand the result over (collectives/momentum_handover.h);
  // m = 0 returns to the configured algorithm. Not collective, but every
  // rank must adopt the same m between the same two calls: the caller
  // agrees on it first (the PyTorch backend does, over its group). The
  // error-feedback state is kept; velocities and mirrors start at zero. A
  // no-op, returning false, where the configuration does not take the
  // optimizer's momentum (takes_optimizer_momentum) or m is already in use.
  // Checkpoints carry m, so a resumed run continues with it.
  // With taken.moved the optimizer runs without its momentum (moved here by
  // the caller) and is handed s_t itself: no hand-over.
  bool adopt_optimizer_momentum(OptimizerMomentum taken);
  OptimizerMomentum optimizer_momentum() const { return optimizer_momentum_; }

  // Writes the stats file (if configured), the COMPCOLL_STATE_DIR
  // checkpoint (if configured) and the summary line; called by the
  // destructor, idempotent.
  void finish();

 private:
  // A failed communicator refuses every call (allreduce, rescale_state,
  // set_discard_nonfinite): kTransport naming the first error.
  void check_not_broken() const;
  // Moves the COMPCOLL_STATE_DIR checkpoint to <file>.unused and, when say,
  // tells why at WARN (once per process).
  void set_aside_unused_checkpoint(const std::string& why, bool say = true);
  void allreduce_on(const Route& route, void* buf, size_t count, DType dtype, ReduceOp op,
                    const char* key);
  // One call's bookkeeping around `run` (state lookup, route log, stats,
  // eviction): run(state, hierarchical) moves the data. state is null on
  // the dense route and on a hierarchy's followers. algorithm_decides: the
  // algorithm object ran, so its last_decision() is this call's.
  using CallRunner = std::function<CallInfo(CodecState* state, bool hierarchical)>;
  void run_call(const Route& route, void* buf, size_t count, DType dtype, ReduceOp op,
                const char* key, bool algorithm_decides, const CallRunner& run);
  // COMPCOLL_STATE_DIR: this rank's file, or "" when off or when another
  // communicator of this process already uses that path.
  std::string state_file_path();
  std::string state_file_prefix() const;
  // Collective: {min, max} of the ranks' clocks (checkpoints saved together
  // carry one).
  std::pair<int64_t, int64_t> clock_range(uint64_t clock);
  void check_stats_file();
  void load_state_dir();
  void start_fresh();  // drops a restored checkpoint (load_state_dir)
  std::string other_world_sizes(bool move);
  // load_state's halves: parse and check (why: "" when usable; a usable
  // file leaves its momentum adopted), put the momentum back and say why,
  // and replace the store with the file's entries.
  StateFile check_state(std::span<const uint8_t> bytes, std::string& why);
  void refuse_state(const OptimizerMomentum& before, const std::string& why, std::string* why_not);
  void apply_state(StateFile& f);
  void release_state_claim();  // lets another communicator of this process use state_path_
  // The description that checkpoints carry: the agreement's, without
  // whether COMPCOLL_STATE_DIR is set (a state_dict checkpoint and a state
  // directory serve the same math).
  std::string state_description() const;
  // At finish: one WARN (rank 0) when compression was asked for and no call
  // was compressed, with why (warm-up, dense routes, the algorithm's choice).
  void warn_if_nothing_compressed() const;
  // A compressing algorithm on a world of one rank saves nothing: WARN once.
  void warn_if_alone() const;

  Config cfg_;
  std::string state_path_;  // claimed COMPCOLL_STATE_DIR file, "" if none
  bool state_claim_released_ = false;  // release_state_claim has run
  StatsFileClaim stats_claim_;  // the COMPCOLL_STATS_FILE path this one writes
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Hierarchy> hier_;  // over *comm_, so declared (and destroyed) after it
  std::unique_ptr<Algorithm> algo_;
  OptimizerMomentum optimizer_momentum_;  // adopted by adopt_optimizer_momentum; m 0: none
  StateStore states_;
  // A partial resume (restored states dropped unused) is said once.
  bool partial_resume_said_ = false;
  // Keys the caller named whose size changed (said once each, C API).
  std::set<std::string> replaced_keys_said_;
  // Evicted states that held error feedback not sent yet: the first time
  // at WARN, later ones at INFO (buffers that move every step evict on
  // every call).
  bool eviction_loss_said_ = false;
  Stats stats_;
  Logger log_;
  std::unordered_map<std::string, std::string> routes_;     // key -> last logged route
  std::unordered_map<std::string, std::string> decisions_;  // key -> auto's last logged choice
  std::string broken_;
  // A call is running (run_call): a second one on another thread is refused.
  std::atomic<bool> in_call_{false};
  bool discard_nonfinite_ = false;  // set_discard_nonfinite
  std::string handover_order_key_;  // set_handover_order_key
  // The order key a tensor's mirror went to (by the tensor's key text): a
  // later call of the same tensor without one (a buffer met again, after
  // its first calls as a fresh one: DDP's rebuilt bucket) keeps that mirror.
  std::unordered_map<std::string, std::string> order_of_tensor_;
  // Under set_discard_nonfinite: the state of the call in flight as it was
  // before it, kept from call to call so its memory is reused (as large as
  // the largest tensor's state, not the sum of them).
  CodecState undo_{0};
  uint64_t discarded_calls_ = 0;
  uint64_t dense_route_calls_ = 0;  // calls sent dense: by choose_route or allreduce_exact
  // Those calls by their route's reason (choose_route's few fixed reasons,
  // and allreduce_exact's), for the warning that nothing was compressed.
  std::map<std::string, uint64_t> dense_by_reason_;
  // allreduce_exact's calls by reason (a front end's few fixed reasons).
  std::map<std::string, uint64_t> exact_by_caller_;
  bool finished_ = false;
  mutable std::mutex snapshot_mu_;  // guards snapshot_
  StatsSnapshot snapshot_;          // stats_snapshot(); updated at the end of every call

  // stats_snapshot's copy of stats_ and state_bytes(), taken on the thread
  // that changed them.
  void refresh_stats_snapshot();
  // Says what StateStore::tick() dropped (see eviction_loss_said_).
  void report_evicted(const StateStore::Evicted& evicted);
  // Collective (creation): decides COMPCOLL_HIERARCHY and builds hier_.
  void setup_hierarchy();
  // At creation: COMPCOLL_CODEC_THREADS=auto becomes a number (config()
  // shows it): 1, or where the communicator stages device tensors for dgc,
  // staged_codec_threads of this rank's machine (collective then: every
  // rank reports its machine's CPUs).
  void resolve_codec_threads();
};

// COMPCOLL_HIERARCHY's decision, collective over `world` when cfg asks for
// a hierarchy and compression is on (every rank gets the same answer): the
// hierarchy compressed calls should take (null: flat) and a log line saying
// why ("" when the hierarchy is off). The Communicator uses it at creation;
// so can tools that run the algorithms directly (the benchmark).
struct HierarchyChoice {
  std::unique_ptr<Hierarchy> hierarchy;
  std::string why;
  // `why` is said at WARN, once per process: COMPCOLL_HIERARCHY asked for a
  // hierarchy that would change nothing (every host has one rank), for
  // shards that run as host would (the transport cannot connect slices, or a
  // host has one rank), or for one where every rank shares one host (the
  // local reduce is the whole allreduce and the lone leader's compression
  // crosses no link).
  bool warn = false;
};
HierarchyChoice choose_hierarchy(Comm& world, const Config& cfg);

}  // namespace compcoll
