// The NCCL interposer's process-wide state and its decisions.
//
// libcompcoll_nccl.so is preloaded (LD_PRELOAD) in front of the real NCCL.
// It defines only the entry points it must see (exports.cc); every other
// nccl* symbol the application uses still binds to the real library. The
// real NCCL is reached through dlopen(COMPCOLL_NCCL_LIBRARY) + dlsym on that
// handle (transport/nccl/nccl_api.h), never through our own exports.
//
// ncclAllReduce is compressed (comm_entry.h) when all of these hold, and
// forwarded untouched otherwise:
//   - COMPCOLL_ALGO is set and not dense (else every call is a pure
//     pass-through: no bookkeeping at all);
//   - the calling thread is not inside ncclGroupStart/ncclGroupEnd (the
//     group's operations must be issued together, by NCCL);
//   - the dtype is float32, float16 or bfloat16, the op SUM or AVG, and
//     count >= COMPCOLL_MIN_ELEMS (collectives/dispatch.h's policy);
//   - the stream is not being captured into a CUDA graph (a synchronous,
//     host-staged call cannot be captured);
//   - the CUDA driver could be loaded;
//   - under COMPCOLL_NCCL_COMMS=multi-host, the communicator's ranks span
//     several hosts (CommEntry::scope_refusal).
//
// Why a process-wide object: an LD_PRELOAD library has no owner to hold its
// state. It is created on first use, never destroyed (other threads may still
// call NCCL while the process exits), and its stats are written at
// ncclCommDestroy/ncclCommAbort and from an atexit handler.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "plugin/logging.h"
#include "plugin/nccl_interposer/comm_entry.h"
#include "plugin/nccl_interposer/launcher_identity.h"
#include "plugin/nccl_interposer/settings.h"
#include "transport/nccl/nccl_api.h"

namespace compcoll::interposer {

class Interposer {
 public:
  // Never throws; load failures are kept and reported by the calls.
  static Interposer& get();

  // The real NCCL; throws kUnsupported when it could not be loaded.
  const nccl::NcclApi& real() const;
  // Throws kInvalidArgument when a COMPCOLL_* value is bad or, given the
  // rank a root communicator is being created with, when compression is on
  // and that rank's COMPCOLL_STATS_FILE or the COMPCOLL_STATE_DIR could not
  // be written at exit. Given the job's nranks too, rank 0 says once at WARN
  // when every rank would write one COMPCOLL_STATS_FILE (no {rank} in it).
  void check_config(int rank = -1, int nranks = 0) const;
  bool enabled() const { return enabled_; }

  // Registry. Roots: origin is their own rank. Children (split, shrink)
  // descend from parent's origin.
  void register_root(ncclComm_t comm);
  void register_child(ncclComm_t child, ncclComm_t parent);
  // For ncclCommDestroy/ncclCommAbort: finishes the entry, writes the stats,
  // then calls the real function unless we aborted the communicator already.
  ncclResult_t destroy(ncclComm_t comm, bool abort);
  // Whether the interposer aborted comm after a timeout (the handle is gone).
  bool aborted_by_us(ncclComm_t comm);
  // Throws kTransport naming call when compcoll aborted comm (its handle
  // is gone and must not reach NCCL).
  void check_not_aborted_by_us(ncclComm_t comm, const char* call);

  ncclResult_t allreduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  // Forwarded untouched; a floating-point SUM/AVG of at least
  // COMPCOLL_MIN_ELEMS elements in all is said at WARN, once per process, to
  // go uncompressed (sharded training's gradients travel this way).
  ncclResult_t reduce_scatter(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

  // Mixed precision, told by the compcoll Python package's torch.amp.GradScaler
  // wrappers (exports.cc: compcoll_nccl_loss_scale_changed and
  // compcoll_nccl_note_loss_scaled; integration/pytorch/compcoll/_loss_scale.py).
  // The gradients NCCL reduces are the true ones times the loss scale, and so
  // is whatever error feedback keeps. loss_scale_changed multiplies every
  // live communicator's state by factor (new scale / old scale; finite and
  // > 0, else kInvalidArgument) and returns how many states it rescaled.
  // note_loss_scaled: a scaler is in charge, so a call whose result is not
  // finite (an overflowed step, which the scaler skips) leaves its state as
  // it was, on every communicator, live or made later.
  size_t loss_scale_changed(double factor);
  void note_loss_scaled();

  // Group depth of the calling thread (ncclGroupStart/End nest).
  static void group_started();
  static void group_ended();
  static int group_depth();

  // At exit: finishes the communicators the program never destroyed (their
  // COMPCOLL_STATE_DIR checkpoints), then writes the stats file of every
  // origin rank. Once per process, however often it is registered.
  void finish_at_exit();
  // Whether there is exit work (COMPCOLL_STATS_FILE, COMPCOLL_STATE_DIR, or
  // COMPCOLL_NCCL_COMMS=multi-host's check that it left something compressed).
  bool has_exit_work() const;

 private:
  Interposer();

  std::shared_ptr<CommEntry> add_entry(ncclComm_t comm, int parent_id, int origin_rank,
                                       std::string lineage = "");
  std::shared_ptr<CommEntry> find(ncclComm_t comm);
  std::shared_ptr<CommEntry> find_or_add(ncclComm_t comm);
  std::vector<std::shared_ptr<CommEntry>> live_entries();
  // Why the call must be forwarded, or nothing when it is compressed.
  std::optional<std::string> forward_reason(size_t count, ncclDataType_t dtype, ncclRedOp_t op,
                                            cudaStream_t stream) const;
  void write_stats(int origin_rank);
  // COMPCOLL_NCCL_COMMS=multi-host left out every communicator that made an
  // eligible call, so it compressed nothing: a WARN, not a silent no-op.
  void warn_if_no_communicator_spans_hosts(const std::vector<CommSnapshot>& comms);

  Settings settings_;
  LauncherIdentity launcher_;  // which process of the job (launcher_identity.h)
  std::string config_error_;  // non-empty: a COMPCOLL_* value was rejected
  std::optional<nccl::NcclApi> nccl_;
  std::string nccl_error_;
  std::optional<nccl::CudaDriverApi> cuda_;
  std::string cuda_error_;
  std::unique_ptr<Algorithm> policy_;  // the configured algorithm, for choose_route
  bool enabled_ = false;
  std::atomic<bool> exited_{false};  // finish_at_exit ran
  std::atomic<bool> loss_scaled_{false};      // note_loss_scaled
  std::atomic<bool> reduce_scatter_said_{false};  // reduce_scatter's WARN, once
  std::atomic<uint64_t> loss_scale_changes_{0};  // loss_scale_changed calls
  Logger log_;

  std::mutex mu_;  // guards the registry and the finished list
  std::map<ncclComm_t, std::shared_ptr<CommEntry>> live_;
  std::vector<CommSnapshot> finished_;
  int next_id_ = 0;
  int roots_ = 0;  // root communicators registered: the next root's ordinal
  std::mutex stats_mu_;  // serialises stats file writes
};

}  // namespace compcoll::interposer
