// libnccl.so.2 stand-in for CPU-only tests: the NCCL entry points the test
// program and the interposer use, over host memory and the stand-in CUDA
// streams (fake_nccl_world.h says how). Every call is appended to the file
// named by FAKE_NCCL_LOG, one line each:
//   ncclAllReduce comm=<world>:<rank> count=<n> type=<t> op=<o> send=<p> recv=<p> stream=<p>
// so tests can see exactly what reached "NCCL" and with which arguments.
// Communicators are never freed: a second destroy, or any call on a
// destroyed communicator, is logged as MISUSE and fails.
#include <fcntl.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/interposer/fake_cuda.h"
#include "tests/interposer/fake_nccl_world.h"

#define FAKE_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

using fakenccl::Comm;
using fakenccl::Kind;
using fakenccl::Part;
using fakenccl::World;

namespace {

void log_line(const char* fmt, ...) {
  static const int fd = [] {
    const char* path = std::getenv("FAKE_NCCL_LOG");
    return path && *path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  if (fd < 0) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  const size_t len = std::min<size_t>(size_t(n), sizeof buf - 2);
  buf[len] = '\n';
  [[maybe_unused]] const ssize_t w = write(fd, buf, len + 1);  // one write per line: atomic with O_APPEND
}

thread_local std::string t_last_error;

ncclResult_t misuse(const char* fn, const std::string& why) {
  t_last_error = std::string(fn) + ": " + why;
  log_line("MISUSE %s: %s", fn, why.c_str());
  std::fprintf(stderr, "fake nccl: MISUSE %s: %s\n", fn, why.c_str());
  return ncclInvalidUsage;
}

ncclResult_t check(Comm* c, const char* fn) {
  if (c == nullptr) return misuse(fn, "null communicator");
  if (c->destroyed) return misuse(fn, "communicator " + std::to_string(c->id) + ":" + std::to_string(c->rank) + " was destroyed");
  return ncclSuccess;
}

// One operation of the calling thread, queued while a group is open.
struct Pending {
  Comm* comm = nullptr;
  bool p2p = false;
  bool is_send = false;
  int peer = 0;
  uint64_t seq = 0;
  Part part;
  size_t bytes = 0;
  CUstream stream = nullptr;
};
thread_local int t_depth = 0;
thread_local std::vector<Pending> t_group;

// Posts every arrival and send first, then every completion and receive, so a
// group of sends and receives between two ranks cannot deadlock.
void submit(std::vector<Pending>& ops) {
  for (const Pending& p : ops) {
    if (p.p2p && !p.is_send) continue;
    fakecuda::enqueue(p.stream, [p] {
      if (p.p2p) p.comm->world->post(p.comm->rank, p.peer, p.part.send, p.bytes);
      else p.comm->world->arrive(p.seq, p.comm->rank, p.part);
      return true;
    });
  }
  for (const Pending& p : ops) {
    if (p.p2p && p.is_send) continue;
    fakecuda::enqueue(p.stream, [p] {
      ncclResult_t e = ncclSuccess;
      const bool finished = p.p2p ? p.comm->world->try_take(p.peer, p.comm->rank, p.part.recv, p.bytes, &e)
                                  : p.comm->world->done(p.seq, &e);
      if (finished && e != ncclSuccess) p.comm->async_error = e;
      return finished;
    });
  }
  ops.clear();
}

ncclResult_t issue(Pending p) {
  if (!p.p2p) p.seq = p.comm->next_seq++;
  std::vector<Pending> one;
  if (t_depth > 0) {
    t_group.push_back(p);
    return ncclSuccess;
  }
  one.push_back(p);
  submit(one);
  return ncclSuccess;
}

ncclResult_t collective(const char* fn, Comm* c, Kind kind, const void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, int root, cudaStream_t stream) {
  log_line("%s comm=%d:%d count=%zu type=%d op=%d root=%d send=%p recv=%p stream=%p", fn,
           c ? c->id : -1, c ? c->rank : -1, count, int(type), int(op), root, send, recv,
           static_cast<void*>(stream));
  if (const ncclResult_t r = check(c, fn); r != ncclSuccess) return r;
  Pending p;
  p.comm = c;
  p.part = Part{kind, send, recv, count, type, op, root};
  p.stream = reinterpret_cast<CUstream>(stream);
  return issue(p);
}

std::mutex g_mu;
std::map<std::string, std::shared_ptr<World>> g_worlds;  // by unique id

ncclResult_t init_rank(const char* fn, ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const std::string key(id.internal, strnlen(id.internal, NCCL_UNIQUE_ID_BYTES));
  std::shared_ptr<World> w;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto& slot = g_worlds[key];
    if (!slot) slot = std::make_shared<World>(nranks, fakenccl::next_comm_id());
    w = slot;
  }
  if (nranks != w->size() || rank < 0 || rank >= nranks) {
    return misuse(fn, "rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                          " does not fit a world of " + std::to_string(w->size()));
  }
  Comm* c = fakenccl::new_comm();
  c->world = w;
  c->rank = rank;
  c->id = w->id();
  *comm = reinterpret_cast<ncclComm_t>(c);
  log_line("%s comm=%d:%d nranks=%d handle=%p", fn, c->id, rank, nranks, static_cast<void*>(c));
  return ncclSuccess;
}

Comm* as(ncclComm_t c) { return reinterpret_cast<Comm*>(c); }

}  // namespace

FAKE_NCCL_EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int counter = 0;
  std::lock_guard<std::mutex> lk(g_mu);
  std::snprintf(id->internal, NCCL_UNIQUE_ID_BYTES, "fake-nccl-%d-%d", int(getpid()), counter++);
  return ncclSuccess;
}

FAKE_NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t r) {
  static const char* names[] = {"no error", "unhandled cuda error", "unhandled system error",
                                "internal error", "invalid argument", "invalid usage",
                                "remote process exited or there was a network error",
                                "NCCL operation in progress"};
  return int(r) >= 0 && int(r) < 8 ? names[r] : "unknown result code";
}

FAKE_NCCL_EXPORT const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

FAKE_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank("ncclCommInitRank", comm, nranks, id, rank);
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                     int rank, ncclConfig_t* config) {
  const ncclResult_t r = init_rank("ncclCommInitRankConfig", comm, nranks, id, rank);
  if (r != ncclSuccess || config == nullptr || config->blocking != 0) return r;
  // Non-blocking: the communicator finishes initialising in the background
  // (here: after a few polls of its asynchronous state).
  as(*comm)->init_polls = 3;
  as(*comm)->async_error = ncclInProgress;
  return ncclInProgress;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int*) {
  // The real one opens a group around its per-device inits through the
  // public ncclGroupStart/End, which an interposer sees (re-entrantly).
  if (const ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
  auto w = std::make_shared<World>(ndev, fakenccl::next_comm_id());
  for (int r = 0; r < ndev; ++r) {
    Comm* c = fakenccl::new_comm();
    c->world = w;
    c->rank = r;
    c->id = w->id();
    comms[r] = reinterpret_cast<ncclComm_t>(c);
  }
  log_line("ncclCommInitAll comm=%d ndev=%d", w->id(), ndev);
  return ncclGroupEnd();
}

// Blocking, like NCCL's: every rank of the parent must call it.
FAKE_NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                            ncclConfig_t*) {
  Comm* c = as(comm);
  log_line("ncclCommSplit comm=%d:%d color=%d key=%d", c ? c->id : -1, c ? c->rank : -1, color, key);
  if (const ncclResult_t r = check(c, "ncclCommSplit"); r != ncclSuccess) return r;
  Part part;
  part.kind = Kind::kSplit;
  part.color = color;
  part.key = key;
  const uint64_t seq = c->next_seq++;
  c->world->arrive(seq, c->rank, part);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  ncclResult_t e = ncclSuccess;
  while (!c->world->done(seq, &e)) {
    if (std::chrono::steady_clock::now() > deadline) return misuse("ncclCommSplit", "peers never arrived");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (e != ncclSuccess) return e;
  *newcomm = reinterpret_cast<ncclComm_t>(c->world->split_child(seq, c->rank));
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  log_line("ncclCommFinalize comm=%d:%d", as(comm) ? as(comm)->id : -1, as(comm) ? as(comm)->rank : -1);
  return check(as(comm), "ncclCommFinalize");
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Comm* c = as(comm);
  log_line("ncclCommDestroy comm=%d:%d", c ? c->id : -1, c ? c->rank : -1);
  if (const ncclResult_t r = check(c, "ncclCommDestroy"); r != ncclSuccess) return r;
  c->destroyed = true;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Comm* c = as(comm);
  log_line("ncclCommAbort comm=%d:%d", c ? c->id : -1, c ? c->rank : -1);
  if (const ncclResult_t r = check(c, "ncclCommAbort"); r != ncclSuccess) return r;
  c->world->abort();
  c->destroyed = true;
  return ncclSuccess;
}

// The real NCCL's queries start with ncclCommEnsureReady, which calls the
// public ncclCommGetAsyncError: through the PLT, so with an interposer
// preloaded the call lands in the interposer, from inside the interposer's
// own call (it asks for the rank while it registers a communicator). The
// stand-in does the same so that the CPU tests meet that re-entry.
static ncclResult_t ensure_ready(ncclComm_t comm, const char* fn) {
  if (const ncclResult_t r = check(as(comm), fn); r != ncclSuccess) return r;
  ncclResult_t async = ncclSuccess;
  if (const ncclResult_t r = ncclCommGetAsyncError(comm, &async); r != ncclSuccess) return r;
  if (async == ncclInProgress) {
    return misuse(fn, "attempt to use the communicator before its initialisation returned ncclSuccess");
  }
  return async == ncclSuccess ? ncclSuccess : misuse(fn, "the communicator has an asynchronous error");
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (const ncclResult_t r = ensure_ready(comm, "ncclCommCount"); r != ncclSuccess) return r;
  *count = as(comm)->world->size();
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (const ncclResult_t r = ensure_ready(comm, "ncclCommUserRank"); r != ncclSuccess) return r;
  *rank = as(comm)->rank;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (const ncclResult_t r = check(as(comm), "ncclCommCuDevice"); r != ncclSuccess) return r;
  *device = 0;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (const ncclResult_t r = check(as(comm), "ncclCommGetAsyncError"); r != ncclSuccess) return r;
  Comm* c = as(comm);
  if (c->init_polls > 0 && --c->init_polls == 0) {
    ncclResult_t initialising = ncclInProgress;
    c->async_error.compare_exchange_strong(initialising, ncclSuccess);
  }
  *e = c->async_error;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclGroupStart() {
  log_line("ncclGroupStart depth=%d", t_depth);
  ++t_depth;
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclGroupEnd() {
  log_line("ncclGroupEnd depth=%d", t_depth);
  if (t_depth == 0) return misuse("ncclGroupEnd", "no group is open");
  if (--t_depth == 0) submit(t_group);
  return ncclSuccess;
}

FAKE_NCCL_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", as(comm), Kind::kAllReduce, send, recv, count, type, op, 0, stream);
}

FAKE_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                                ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                                cudaStream_t stream) {
  return collective("ncclReduceScatter", as(comm), Kind::kReduceScatter, send, recv, count, type, op, 0,
                    stream);
}

FAKE_NCCL_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                                            ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", as(comm), Kind::kAllGather, send, recv, count, type, ncclSum, 0, stream);
}

FAKE_NCCL_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                            int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclBroadcast", as(comm), Kind::kBroadcast, send, recv, count, type, ncclSum, root,
                    stream);
}

static ncclResult_t point_to_point(const char* fn, bool is_send, const void* send, void* recv, size_t count,
                            ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  Comm* c = as(comm);
  log_line("%s comm=%d:%d count=%zu type=%d peer=%d buf=%p stream=%p", fn, c ? c->id : -1,
           c ? c->rank : -1, count, int(type), peer, is_send ? send : recv, static_cast<void*>(stream));
  if (const ncclResult_t r = check(c, fn); r != ncclSuccess) return r;
  if (peer < 0 || peer >= c->world->size()) return misuse(fn, "peer out of range");
  Pending p;
  p.comm = c;
  p.p2p = true;
  p.is_send = is_send;
  p.peer = peer;
  p.part.send = send;
  p.part.recv = recv;
  p.bytes = count * fakenccl::type_size(type);
  p.stream = reinterpret_cast<CUstream>(stream);
  return issue(p);
}

FAKE_NCCL_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                                       ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclSend", true, send, nullptr, count, type, peer, comm, stream);
}

FAKE_NCCL_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer,
                                       ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclRecv", false, nullptr, recv, count, type, peer, comm, stream);
}
