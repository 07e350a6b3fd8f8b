// The NCCL entry points libcompcoll_nccl.so defines. Everything else the
// application calls binds to the real NCCL, untouched. Each function:
// resolves the real entry through Interposer (dlopen'ed NCCL), runs inside
// guard() (no exception crosses this boundary; failures become an
// ncclResult_t and this thread's last error), and keeps the interposer's
// per-communicator registry and group depth up to date.
#include <nccl.h>


#include "compcoll/error.h"
#include "compcoll/nccl_interposer.h"
#include "plugin/nccl_interposer/c_boundary.h"
#include "plugin/nccl_interposer/interposer.h"

#define CC_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

using compcoll::interposer::guard;
using compcoll::interposer::Interposer;

namespace {

// An optional entry of the real NCCL, or an error naming it.
template <typename Fn>
Fn need(Fn fn, const char* name) {
  CC_CHECK(fn != nullptr, kUnsupported, "the NCCL loaded by the compcoll interposer (",
           Interposer::get().real().path, ") has no ", name);
  return fn;
}

bool created(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// NCCL calls some of its own public entry points while it runs:
// ncclCommUserRank and ncclCommCount begin with ncclCommGetAsyncError
// (ncclCommEnsureReady), ncclCommInitAll opens a group with
// ncclGroupStart/End. With the interposer preloaded those calls resolve to
// the exports below, on the same thread and from inside one of our own
// entry points, which may hold the registry's lock (registering a
// communicator asks NCCL for its rank). They are NCCL's own business: a
// re-entered export forwards to the real entry untouched, takes no lock and
// keeps no books. Seen on the real NCCL 2.28 as a deadlock at the first
// ncclCommInitRank with COMPCOLL_ALGO set.
thread_local int t_depth = 0;

class EntryScope {
 public:
  EntryScope() { ++t_depth; }
  ~EntryScope() { --t_depth; }
  EntryScope(const EntryScope&) = delete;
  EntryScope& operator=(const EntryScope&) = delete;
};

bool reentered() { return t_depth > 0; }

// The body of an export entered from the application: marked as ours for
// the calls NCCL makes back into us, and no exception crosses it.
template <typename Fn>
ncclResult_t entry(const char* where, Fn&& fn) noexcept {
  EntryScope scope;
  return guard(where, std::forward<Fn>(fn));
}

const compcoll::nccl::NcclApi& real() { return Interposer::get().real(); }

// A re-entered call to the real entry (an optional one NCCL lacks cannot be
// re-entered from NCCL, but answer it anyway).
template <typename Fn, typename... Args>
ncclResult_t forward(Fn fn, Args... args) {
  return fn != nullptr ? fn(args...) : ncclInvalidUsage;
}

}  // namespace

CC_NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op,
                                          ncclComm_t comm, cudaStream_t stream) {
  if (reentered()) {
    return forward(real().AllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  return entry("ncclAllReduce", [&] {
    return Interposer::get().allreduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  });
}

// Never compressed; wrapped only so that a program whose gradients travel
// as reduce-scatters (FSDP, ZeRO) is told so instead of compressing nothing
// in silence.
CC_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                              size_t recvcount, ncclDataType_t datatype,
                                              ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream) {
  if (reentered()) {
    return forward(real().ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  }
  return entry("ncclReduceScatter", [&] {
    return Interposer::get().reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm,
                                            stream);
  });
}

CC_NCCL_EXPORT ncclResult_t ncclGroupStart() {
  if (reentered()) return forward(real().GroupStart);
  return entry("ncclGroupStart", [] {
    Interposer& ip = Interposer::get();
    const ncclResult_t r = ip.real().GroupStart();
    if (r == ncclSuccess && ip.enabled()) Interposer::group_started();
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclGroupEnd() {
  if (reentered()) return forward(real().GroupEnd);
  return entry("ncclGroupEnd", [] {
    Interposer& ip = Interposer::get();
    if (ip.enabled()) Interposer::group_ended();  // NCCL leaves the group even when it fails
    return ip.real().GroupEnd();
  });
}

CC_NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (reentered()) return forward(real().GroupSimulateEnd, simInfo);
  return entry("ncclGroupSimulateEnd", [&] {
    Interposer& ip = Interposer::get();
    const auto fn = need(ip.real().GroupSimulateEnd, "ncclGroupSimulateEnd");
    if (ip.enabled()) Interposer::group_ended();
    return fn(simInfo);
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                             int rank) {
  if (reentered()) return forward(real().CommInitRank, comm, nranks, commId, rank);
  return entry("ncclCommInitRank", [&] {
    Interposer& ip = Interposer::get();
    ip.check_config(rank, nranks);  // a bad COMPCOLL_* value fails before any traffic
    const ncclResult_t r = ip.real().CommInitRank(comm, nranks, commId, rank);
    if (created(r)) ip.register_root(*comm);
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                   ncclUniqueId commId, int rank,
                                                   ncclConfig_t* config) {
  if (reentered()) return forward(real().CommInitRankConfig, comm, nranks, commId, rank, config);
  return entry("ncclCommInitRankConfig", [&] {
    Interposer& ip = Interposer::get();
    ip.check_config(rank, nranks);
    const auto fn = need(ip.real().CommInitRankConfig, "ncclCommInitRankConfig");
    const ncclResult_t r = fn(comm, nranks, commId, rank, config);
    if (created(r)) ip.register_root(*comm);
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                     int nId, ncclUniqueId* commIds,
                                                     ncclConfig_t* config) {
  if (reentered()) {
    return forward(real().CommInitRankScalable, newcomm, nranks, myrank, nId, commIds, config);
  }
  return entry("ncclCommInitRankScalable", [&] {
    Interposer& ip = Interposer::get();
    ip.check_config(myrank, nranks);
    const auto fn = need(ip.real().CommInitRankScalable, "ncclCommInitRankScalable");
    const ncclResult_t r = fn(newcomm, nranks, myrank, nId, commIds, config);
    if (created(r)) ip.register_root(*newcomm);
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (reentered()) return forward(real().CommInitAll, comms, ndev, devlist);
  return entry("ncclCommInitAll", [&] {
    Interposer& ip = Interposer::get();
    ip.check_config();  // a bad COMPCOLL_* value, whatever ndev is
    for (int i = 0; i < ndev; ++i) ip.check_config(i, ndev);  // rank i's output paths
    const ncclResult_t r = ip.real().CommInitAll(comms, ndev, devlist);
    if (created(r)) {
      for (int i = 0; i < ndev; ++i) ip.register_root(comms[i]);
    }
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                          ncclConfig_t* config) {
  if (reentered()) return forward(real().CommSplit, comm, color, key, newcomm, config);
  return entry("ncclCommSplit", [&] {
    Interposer& ip = Interposer::get();
    const auto fn = need(ip.real().CommSplit, "ncclCommSplit");
    ip.check_not_aborted_by_us(comm, "ncclCommSplit");
    const ncclResult_t r = fn(comm, color, key, newcomm, config);
    if (created(r) && newcomm != nullptr) ip.register_child(*newcomm, comm);  // null: NOCOLOR
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                           int excludeRanksCount, ncclComm_t* newcomm,
                                           ncclConfig_t* config, int shrinkFlags) {
  if (reentered()) {
    return forward(real().CommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config,
                   shrinkFlags);
  }
  return entry("ncclCommShrink", [&] {
    Interposer& ip = Interposer::get();
    const auto fn = need(ip.real().CommShrink, "ncclCommShrink");
    ip.check_not_aborted_by_us(comm, "ncclCommShrink");
    const ncclResult_t r = fn(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
    if (created(r) && newcomm != nullptr) ip.register_child(*newcomm, comm);
    return r;
  });
}

CC_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (reentered()) return forward(real().CommDestroy, comm);
  return entry("ncclCommDestroy", [&] { return Interposer::get().destroy(comm, /*abort=*/false); });
}

CC_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (reentered()) return forward(real().CommAbort, comm);
  return entry("ncclCommAbort", [&] { return Interposer::get().destroy(comm, /*abort=*/true); });
}

CC_NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (reentered()) return forward(real().CommFinalize, comm);
  return entry("ncclCommFinalize", [&] {
    Interposer& ip = Interposer::get();
    const auto fn = need(ip.real().CommFinalize, "ncclCommFinalize");
    if (ip.aborted_by_us(comm)) return ncclSuccess;  // nothing is left in flight
    return fn(comm);
  });
}

// After compcoll aborted a communicator (timeout) the handle is gone: report
// the failure as NCCL would (a remote error) instead of touching it.
CC_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (reentered()) return forward(real().CommGetAsyncError, comm, asyncError);
  return entry("ncclCommGetAsyncError", [&] {
    Interposer& ip = Interposer::get();
    if (ip.aborted_by_us(comm)) {
      *asyncError = ncclRemoteError;
      return ncclSuccess;
    }
    return ip.real().CommGetAsyncError(comm, asyncError);
  });
}

CC_NCCL_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  try {
    const std::string& ours = compcoll::interposer::last_error();
    if (!ours.empty()) return ours.c_str();
    const auto& real = Interposer::get().real();
    if (real.GetLastError != nullptr) return real.GetLastError(comm);
  } catch (...) {
  }
  return "";
}

// compcoll's own entry points, not NCCL's (include/compcoll/nccl_interposer.h):
// the compcoll Python package finds them in the process (dlsym) when the
// interposer is preloaded, and calls them from its torch.amp.GradScaler
// wrappers (interposer.h, "Mixed precision"). Errors as NCCL's: a result,
// and ncclGetLastError(NULL).
CC_NCCL_EXPORT ncclResult_t compcoll_nccl_loss_scale_changed(double factor, size_t* rescaled) {
  return entry("compcoll_nccl_loss_scale_changed", [&] {
    const size_t n = Interposer::get().loss_scale_changed(factor);
    if (rescaled != nullptr) *rescaled = n;
    return ncclSuccess;
  });
}

CC_NCCL_EXPORT ncclResult_t compcoll_nccl_note_loss_scaled() {
  return entry("compcoll_nccl_note_loss_scaled", [&] {
    Interposer::get().note_loss_scaled();
    return ncclSuccess;
  });
}
