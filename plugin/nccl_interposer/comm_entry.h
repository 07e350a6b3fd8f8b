// One NCCL communicator as the interposer sees it: its place in the split
// tree, its compcoll Communicator (made at its first compressed call), the
// calls forwarded to NCCL untouched, and a snapshot of its stats.
//
// The compressed path is synchronous with the caller's stream and runs the
// configured algorithm through plugin/communicator.h (its payloads travel
// over the same NCCL communicator through NcclComm, on the same stream):
//   on the device  where COMPCOLL_DEVICE_CODECS=auto and the call allows it
//                  (Communicator::device_route_refusal), the GPU codecs
//                  encode the caller's buffer where it lies and decode the
//                  ranks' payloads into its output (collectives/cuda/);
//   host-staged    otherwise: copy the caller's buffer to host memory, run
//                  the CPU codec there, copy the result to the output.
// Both return once the stream has drained, with the same bits. Later work
// on the stream therefore sees the result; nothing is left in flight.
//
// Error-feedback state is the Communicator's, keyed by the caller's output
// device address, count and dtype: per communicator, so the parent and the
// children of ncclCommSplit never share residuals.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/communicator.h"
#include "plugin/logging.h"
#include "plugin/nccl_interposer/buffer_keys.h"
#include "plugin/nccl_interposer/launcher_identity.h"
#include "plugin/stats.h"
#include "transport/nccl/nccl_comm.h"

namespace compcoll::interposer {

struct CommSnapshot {
  int id = 0;
  int parent = -1;       // id of the communicator it was split from, -1 for a root
  int rank = -1;         // -1 while NCCL cannot say yet (non-blocking init)
  int size = -1;
  int origin_rank = -1;  // rank in the root it descends from: names the stats file
  // The Communicator's counters, and the forwarded calls as dense calls.
  StatsCounters counters;
  uint64_t forwarded_calls = 0;  // handed to NCCL uncompressed
  uint64_t state_entries = 0;
  uint64_t state_bytes = 0;
  bool destroyed = false;
  // COMPCOLL_NCCL_COMMS=multi-host found all its ranks on one host: every
  // allreduce of it is forwarded (CommEntry::left_out() when snapshotted).
  bool single_host = false;
};

// What every entry shares with the interposer (owned by it, never freed).
struct Runtime {
  const nccl::NcclApi* nccl = nullptr;
  const nccl::CudaDriverApi* cuda = nullptr;
  const Config* config = nullptr;
  // Called once a device route has started the CUDA runtime, which tears
  // itself down in an exit handler of its own: the interposer's exit work
  // (checkpoints of device-resident states) must be registered after it.
  void (*cuda_runtime_started)() = nullptr;
  // Set once a loss scaler is in charge (Interposer::note_loss_scaled):
  // Communicators made after that undo calls with a non-finite result too.
  const std::atomic<bool>* loss_scaled = nullptr;
  // Which process of the job this is (launcher_identity.h): names the
  // COMPCOLL_STATE_DIR files of roots that are not the world.
  const LauncherIdentity* launcher = nullptr;
};

class CommEntry {
 public:
  // origin_rank: the parent's origin for a split child; for a root, the
  // launcher's rank of this process, or -1 (its own rank, once known).
  // lineage: next_child_lineage() of the parent for a child. root_ordinal:
  // for a root, how many roots this process made before it (-1 for a child).
  CommEntry(const Runtime& rt, ncclComm_t comm, int id, int parent, int origin_rank,
            std::string lineage = "", int root_ordinal = -1);
  ~CommEntry();

  CommEntry(const CommEntry&) = delete;
  CommEntry& operator=(const CommEntry&) = delete;

  ncclComm_t handle() const { return comm_; }
  int id() const { return id_; }
  int origin_rank();
  // The name of this communicator's next split (or shrunk) child in its
  // COMPCOLL_STATE_DIR file: "split0", "split1", then "split0.split0" for a
  // grandchild, after the root's tag (root_state_tag) when it has one.
  // Splits are collective and ordered, so a restarted program's children
  // get the same names whatever their ids or handles, and a child as large
  // as its parent does not collide with it in one file. The file of a child
  // also names its origin rank (state_tag()): children of one split in
  // different processes have the same lineage and may have the same rank
  // and size (pairs {0,1} and {2,3}: both "rank 0 of 2").
  std::string next_child_lineage();
  // What names this communicator's COMPCOLL_STATE_DIR file beside its rank
  // and size: unique in the job, the same in every run of the program.
  std::string state_tag();
  // True once NcclComm aborted the NCCL communicator (timeout, async error):
  // the handle is gone and must not reach NCCL again.
  bool aborted() const;

  // Accounts (and logs, once per distinct shape and reason) a call that is
  // forwarded to NCCL untouched. gradient_like: a floating-point SUM or AVG
  // of at least COMPCOLL_MIN_ELEMS elements, which the user set
  // COMPCOLL_ALGO to compress: its reason (float64, a group, a CUDA graph)
  // is said at WARN, once per reason, by the communicator's rank 0.
  void note_forwarded(size_t count, size_t elem_bytes, const char* dtype, const char* op,
                      const std::string& reason, bool gradient_like);

  // Why an eligible call of this communicator is forwarded all the same, or
  // "" when it is compressed: under COMPCOLL_NCCL_COMMS=multi-host, its
  // ranks all share one host. Decided at its first eligible call, which
  // every rank makes (collective: the ranks exchange their host ids over the
  // communicator), then remembered. Throws compcoll::Error (a timeout, ranks
  // whose COMPCOLL_NCCL_COMMS differ).
  std::string scope_refusal(CUstream stream);
  // scope_refusal() decided to leave this communicator to NCCL: what it
  // forwards is not what COMPCOLL_ALGO was set to compress here.
  bool left_out() const { return left_out_.load(); }

  // The compressed allreduce (see the file comment). Throws compcoll::Error.
  void compressed_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            CUstream stream);

  // Mixed precision (Interposer::loss_scale_changed / note_loss_scaled):
  // multiplies the error-feedback state by factor (how many states; 0
  // before the first compressed call), and from now on leaves the state as
  // it was after a call whose result is not finite (a step the loss scaler
  // skips; Communicator::set_discard_nonfinite). Each waits for a call in
  // flight on this communicator.
  size_t rescale_state(float factor);
  void discard_nonfinite();

  // Releases the Communicator and the NcclComm (device memory); called
  // before the real ncclCommDestroy. Idempotent.
  void finish();
  // The program's ncclCommAbort: real_abort (the real one) first, then what
  // finish() releases. Freeing device memory waits for the device's work, and
  // a kernel waiting for a dead peer ends only with the abort, so the other
  // order would hang. A call of another thread in flight is stopped first
  // (NcclCommOptions::stop: it aborts the communicator itself, and then
  // real_abort is not called again); one that does not end within the
  // timeout is named at WARN, the abort goes ahead and its memory is left.
  // Returns real_abort's result, or ncclSuccess when compcoll had aborted.
  ncclResult_t abort_then_finish(const std::function<ncclResult_t()>& real_abort);
  // At process exit, for a communicator the program never destroyed: what
  // its Communicator does when it is destroyed (its COMPCOLL_STATE_DIR
  // checkpoint, its summary line), touching neither NCCL nor the device. A
  // call still in flight after a bounded wait is named, and nothing saved.
  void finish_at_exit();

  // refresh: first ask NCCL for rank and size if still unknown (never for a
  // handle that may be gone).
  CommSnapshot snapshot(bool refresh = true);

 private:
  void ensure_transport(CUstream stream);
  void ensure_communicator(CUstream stream);
  void make_device_route(const Config& cfg);  // sets device_ or device_why_
  // Why this call is staged through host memory ("" when the device route
  // takes it); logged once per distinct reason at INFO.
  std::string staging_reason(const void* send, const void* recv, size_t count, DType dtype,
                             ReduceOp op);
  void refresh_identity();  // rank and size, once NCCL can say
  std::string lineage();    // see lineage_
  void publish();           // copies the Communicator's stats into snap_

  Runtime rt_;
  ncclComm_t comm_;
  int id_;
  int parent_;
  // A child's, as given; a root's, root_state_tag() once its rank is known
  // (lineage_decided_; guarded by snap_mu_).
  std::string lineage_;
  const int root_ordinal_;
  bool lineage_decided_ = false;
  std::atomic<int> children_{0};
  Logger log_;

  std::mutex call_mu_;  // one compressed call at a time per communicator
  std::unique_ptr<nccl::NcclComm> transport_;
  std::unique_ptr<Communicator> communicator_;
  // The GPU codecs' route (collectives/device_route.h), made with the
  // Communicator; null when there is none, and device_why_ says why.
  std::unique_ptr<DeviceRoute> device_;
  std::string device_why_;
  std::set<std::string> staged_reasons_;  // guarded by call_mu_
  std::optional<std::string> scope_refusal_;  // guarded by call_mu_; set once decided
  std::atomic<bool> left_out_{false};
  std::vector<uint8_t> host_;
  BufferKeys keys_;  // guarded by call_mu_
  std::atomic<bool> aborted_{false};
  std::atomic<bool> stop_{false};  // abort_then_finish: NcclCommOptions::stop

  mutable std::mutex snap_mu_;  // guards everything below (never held across NCCL calls)
  CommSnapshot snap_;
  Stats forwarded_;
  std::set<std::string> logged_;
  std::set<std::string> warned_reasons_;
};

}  // namespace compcoll::interposer
