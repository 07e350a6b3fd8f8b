#include "transport/nccl/nccl_comm.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "collectives/dense.h"
#include "compcoll/error.h"

namespace compcoll::nccl {
namespace {

using Clock = std::chrono::steady_clock;

// Device arena regions start on this boundary (NCCL and copies like it).
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt8: return ncclInt8;
  }
  CC_THROW(kInvalidArgument, "dtype ", int(d), " has no NCCL equivalent");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kAvg: break;
  }
  CC_THROW(kInvalidArgument, "NcclComm::allreduce takes SUM, MIN, MAX or PROD; AVG is a SUM "
           "followed by a division, done by the collectives");
}

}  // namespace

// The bookkeeping of one NcclComm call: usability check, the comm's device
// context made current, the deadline, and conversion of every failure into
// Error(kTransport) with the rank and the call named.
class NcclCall {
 public:
  // teardown: skip the usability check (the destructor frees memory of a
  // broken communicator too).
  NcclCall(NcclComm& c, const char* op, bool teardown = false) : c_(c), op_(op) {
    CC_CHECK(teardown || c_.broken_.empty(), kTransport, c_.who(), ": ", op,
             " on a communicator that failed earlier; it must be rebuilt. First error: ",
             c_.broken_);
    // The owner is aborting the communicator (ncclCommAbort from another
    // thread): it may already have done so under a call that overran, so
    // the handle is not touched again, not even to abort it.
    if (!teardown && c_.stop_ != nullptr && c_.stop_->load(std::memory_order_acquire)) {
      c_.broken_ = std::string(op) + ": the communicator's owner aborts it (ncclCommAbort)";
      CC_THROW(kTransport, c_.who(), ": NCCL ", op, " refused: ", c_.broken_);
    }
    deadline_ = Clock::now() + c_.timeout_;
    ++c_.calls_;
    push_context();
  }
  ~NcclCall() {
    if (pushed_) {
      CUcontext ignored = nullptr;
      c_.cuda_.CtxPopCurrent(&ignored);
    }
  }
  NcclCall(const NcclCall&) = delete;
  NcclCall& operator=(const NcclCall&) = delete;

  void cu(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) fail(std::string(what) + ": " + c_.cuda_.describe(r), false);
  }

  // Checks an NCCL return; ncclInProgress (non-blocking communicators) is
  // awaited until the operation is enqueued or fails.
  void nc(ncclResult_t r, const char* what) {
    if (r == ncclInProgress) r = await_async(what);
    if (r != ncclSuccess) fail(std::string(what) + ": " + c_.nccl_.describe(r, c_.comm_), false);
  }

  // Every host buffer here is pageable (vectors, the caller's), and a copy
  // between pageable and device memory may return only once it is done,
  // that is once everything ahead of it on the stream is: behind a kernel
  // that waits for a dead peer, never, and the polled wait below with its
  // deadline would not be reached. So the stream is drained first, by that
  // wait; the copy itself then waits for nothing but itself.
  void h2d(CUdeviceptr dst, const void* src, size_t n) {
    if (n == 0) return;
    wait("the work ahead of a host-to-device copy");
    cu(c_.cuda_.MemcpyHtoDAsync(dst, src, n, c_.stream_), "cuMemcpyHtoDAsync");
  }
  void d2h(void* dst, CUdeviceptr src, size_t n) {
    if (n == 0) return;
    wait("the work ahead of a device-to-host copy");
    cu(c_.cuda_.MemcpyDtoHAsync(dst, src, n, c_.stream_), "cuMemcpyDtoHAsync");
  }

  // Polls until the stream has drained, NCCL reports an asynchronous error,
  // or the deadline passes (then the communicator is aborted). A drained
  // stream is success only if NCCL has no asynchronous error either: a
  // failed or aborted NCCL operation may end its kernels early, and the
  // stream then drains over buffers that hold no result.
  void wait(const char* what) {
    for (int spins = 0;; ++spins) {
      const CUresult q = c_.cuda_.StreamQuery(c_.stream_);
      if (q == CUDA_SUCCESS) {
        check_async(what);
        return;
      }
      if (q != CUDA_ERROR_NOT_READY) fail(std::string(what) + ": cuStreamQuery: " + c_.cuda_.describe(q), true);
      check_async(what);
      check_stop(what);
      if (Clock::now() >= deadline_) timed_out(what);
      backoff(spins);
    }
  }

  [[noreturn]] void fail(const std::string& detail, bool abort, bool timed_out = false) {
    if (c_.broken_.empty()) c_.broken_ = std::string(op_) + ": " + detail;
    if (abort && !c_.aborted_) {
      c_.aborted_ = true;
      c_.nccl_.CommAbort(c_.comm_);  // unblocks kernels waiting for peers
    }
    const char* aborted = abort ? " (the NCCL communicator was aborted)" : "";
    if (timed_out) CC_THROW_TIMEOUT(c_.timeout_, c_.who(), ": NCCL ", op_, " failed: ", detail, aborted);
    CC_THROW(kTransport, c_.who(), ": NCCL ", op_, " failed: ", detail, aborted);
  }

 private:
  static void backoff(int spins) {
    if (spins < 64) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 20 * (spins - 63))));
    }
  }

  // The owner asked for the communicator to be aborted (NcclCommOptions::stop).
  void check_stop(const char* what) {
    if (c_.stop_ != nullptr && c_.stop_->load(std::memory_order_acquire)) {
      fail(std::string(what) + ": the communicator's owner aborts it (ncclCommAbort)", true);
    }
  }

  void check_async(const char* what) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = c_.nccl_.CommGetAsyncError(c_.comm_, &async);
    if (r != ncclSuccess) fail(std::string(what) + ": ncclCommGetAsyncError: " + c_.nccl_.describe(r), true);
    if (async != ncclSuccess && async != ncclInProgress) {
      fail(std::string(what) + ": asynchronous NCCL error " + c_.nccl_.describe(async, c_.comm_), true);
    }
  }

  ncclResult_t await_async(const char* what) {
    for (int spins = 0;; ++spins) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = c_.nccl_.CommGetAsyncError(c_.comm_, &async);
      if (r != ncclSuccess) return r;
      if (async != ncclInProgress) return async;
      check_stop(what);
      if (Clock::now() >= deadline_) timed_out(what);
      backoff(spins);
    }
  }

  [[noreturn]] void timed_out(const char* what) {
    fail(std::string("timed out after ") + std::to_string(c_.timeout_.count()) + " ms in " + what +
             " (a peer rank died, stalled, or called a different collective)",
         true, true);
  }

  // NCCL's kernels run in the comm's device's context. The caller usually
  // has it current already; otherwise use the device's primary context (the
  // one the CUDA runtime, and so NCCL, uses).
  void push_context() {
    CUcontext cur = nullptr;
    CUdevice dev = -1;
    if (c_.cuda_.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr &&
        c_.cuda_.CtxGetDevice(&dev) == CUDA_SUCCESS && dev == c_.device_) {
      return;
    }
    if (c_.ctx_ == nullptr) {
      CUdevice d = 0;
      cu(c_.cuda_.DeviceGet(&d, c_.device_), "cuDeviceGet");
      cu(c_.cuda_.DevicePrimaryCtxRetain(&c_.ctx_, d), "cuDevicePrimaryCtxRetain");
    }
    cu(c_.cuda_.CtxPushCurrent(c_.ctx_), "cuCtxPushCurrent");
    pushed_ = true;
  }

  NcclComm& c_;
  const char* op_;
  Clock::time_point deadline_;
  bool pushed_ = false;
};

NcclComm::NcclComm(const NcclApi& nccl, const CudaDriverApi& cuda, ncclComm_t comm,
                   NcclCommOptions options)
    : nccl_(nccl),
      cuda_(cuda),
      comm_(comm),
      timeout_(options.timeout),
      stop_(options.stop),
      stream_(options.stream) {
  CC_CHECK(comm != nullptr, kInvalidArgument, "NcclComm over a null ncclComm_t");
  CC_CHECK(timeout_.count() > 0, kInvalidArgument, "NcclComm timeout must be positive");
  auto query = [&](ncclResult_t r, const char* what) {
    CC_CHECK(r == ncclSuccess, kTransport, "NcclComm: ", what, " failed: ", nccl_.describe(r, comm));
  };
  // A non-blocking communicator (ncclCommInitRankConfig, blocking = 0) may
  // still be initialising when its first compressed call arrives: wait for
  // it, within the timeout, before asking it anything.
  const auto ready_by = Clock::now() + timeout_;
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    query(nccl_.CommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess) break;
    CC_CHECK(state == ncclInProgress, kTransport, "NcclComm: the communicator reports an "
             "asynchronous error: ", nccl_.describe(state, comm));
    CC_CHECK(stop_ == nullptr || !stop_->load(std::memory_order_acquire), kTransport,
             "NcclComm: the communicator's owner aborts it (ncclCommAbort) while it initialises");
    if (Clock::now() >= ready_by) {
      CC_THROW_TIMEOUT(timeout_, "NcclComm: the communicator was still initialising (ncclInProgress) "
                       "after ", timeout_.count(), " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 100 ? 10 : 1000));
  }
  query(nccl_.CommUserRank(comm, &rank_), "ncclCommUserRank");
  query(nccl_.CommCount(comm, &size_), "ncclCommCount");
  query(nccl_.CommCuDevice(comm, &device_), "ncclCommCuDevice");
  if (stream_ == nullptr) {
    NcclCall call(*this, "stream creation");
    call.cu(cuda_.StreamCreate(&own_stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    stream_ = own_stream_;
  }
}

NcclComm::~NcclComm() {
  // No throwing here: release what we can, quietly.
  try {
    NcclCall call(*this, "teardown", /*teardown=*/true);
    release_arena();
    if (own_stream_ != nullptr) cuda_.StreamDestroy(own_stream_);
  } catch (const std::exception&) {
  }
}

void NcclComm::drain(const char* what) {
  NcclCall call(*this, what);
  call.wait(what);
}

std::string NcclComm::who() const {
  return "rank " + std::to_string(rank_) + "/" + std::to_string(size_);
}

void NcclComm::release_arena() {
  if (arena_ != 0) cuda_.MemFree(arena_);
  arena_ = 0;
  arena_bytes_ = 0;
}

CUdeviceptr NcclComm::arena(NcclCall& call, size_t bytes) {
  bytes = std::max<size_t>(align_up(bytes), kAlign);
  if (bytes <= arena_bytes_) return arena_;
  // Our own work has drained (every call waits), but the stream may be the
  // caller's, with its kernels ahead (the interposer's): cuMemFree would wait
  // for them without a deadline, so they are waited for by the polled wait.
  if (arena_ != 0) call.wait("the work ahead of growing the staging memory");
  release_arena();
  const size_t grown = std::max(bytes, arena_bytes_ + arena_bytes_ / 2);
  const CUresult r = cuda_.MemAlloc(&arena_, grown);
  CC_CHECK(r == CUDA_SUCCESS, kTransport, who(), ": cannot allocate ", grown,
           " bytes of device staging memory: ", cuda_.describe(r));
  arena_bytes_ = grown;
  return arena_;
}

Gathered NcclComm::allgatherv(std::span<const uint8_t> send, size_t max_part) {
  check_own_part(send.size(), max_part, "allgatherv");
  NcclCall call(*this, "allgatherv");
  const size_t R = size_t(size_);
  // Round 1: every rank's size. Layout: [my size][R sizes].
  const size_t sizes_at = kAlign;
  CUdeviceptr d = arena(call, sizes_at + R * 8);
  const uint64_t mine = send.size();
  std::vector<uint64_t> sizes(R);
  call.h2d(d, &mine, 8);
  call.nc(nccl_.AllGather(reinterpret_cast<void*>(d), reinterpret_cast<void*>(d + sizes_at), 1,
                          ncclUint64, comm_, stream_),
          "ncclAllGather(sizes)");
  call.d2h(sizes.data(), d + sizes_at, R * 8);
  call.wait("allgatherv sizes");
  uint64_t max = 0;
  for (size_t r = 0; r < R; ++r) {
    if (sizes[r] > max_part) call.fail(oversized_part_message(int(r), sizes[r], max_part), true);
    max = std::max(max, sizes[r]);
  }
  bytes_sent_ += (R - 1) * 8;
  Gathered out;
  out.offsets.assign(R + 1, 0);
  for (size_t r = 0; r < R; ++r) out.offsets[r + 1] = out.offsets[r] + sizes[r];
  out.data.resize(out.offsets[R]);
  if (max == 0) return out;

  // Round 2: payloads padded to the largest. Layout: [mine][R slots].
  const size_t slots_at = align_up(max);
  d = arena(call, slots_at + R * max);
  call.h2d(d, send.data(), send.size());
  call.nc(nccl_.AllGather(reinterpret_cast<void*>(d), reinterpret_cast<void*>(d + slots_at), max,
                          ncclUint8, comm_, stream_),
          "ncclAllGather(payloads)");
  for (size_t r = 0; r < R; ++r) call.d2h(out.data.data() + out.offsets[r], d + slots_at + r * max, sizes[r]);
  call.wait("allgatherv payloads");
  bytes_sent_ += (R - 1) * max;
  return out;
}

std::vector<Bytes> NcclComm::alltoallv(const std::vector<Bytes>& send, size_t max_part) {
  CC_CHECK_EQ(send.size(), size_t(size_), kInvalidArgument, who(),
              ": alltoallv needs one payload per rank");
  for (const Bytes& b : send) check_own_part(b.size(), max_part, "alltoallv");
  NcclCall call(*this, "alltoallv");
  const size_t R = size_t(size_);
  // Round 1: sizes. Layout: [R send sizes][R receive sizes].
  std::vector<uint64_t> out_sizes(R), in_sizes(R, 0);
  for (size_t p = 0; p < R; ++p) out_sizes[p] = send[p].size();
  const size_t recv_at = align_up(R * 8);
  CUdeviceptr d = arena(call, recv_at + R * 8);
  call.h2d(d, out_sizes.data(), R * 8);
  call.nc(nccl_.GroupStart(), "ncclGroupStart");
  for (size_t p = 0; p < R; ++p) {
    if (int(p) == rank_) continue;
    call.nc(nccl_.Send(reinterpret_cast<void*>(d + p * 8), 1, ncclUint64, int(p), comm_, stream_),
            "ncclSend(size)");
    call.nc(nccl_.Recv(reinterpret_cast<void*>(d + recv_at + p * 8), 1, ncclUint64, int(p), comm_,
                       stream_),
            "ncclRecv(size)");
  }
  call.nc(nccl_.GroupEnd(), "ncclGroupEnd");
  call.d2h(in_sizes.data(), d + recv_at, R * 8);
  call.wait("alltoallv sizes");
  in_sizes[rank_] = 0;
  bytes_sent_ += (R - 1) * 8;

  // Round 2: payloads, back to back. Layout: [sends][receives].
  std::vector<size_t> send_at(R + 1, 0), recv_off(R + 1, 0);
  for (size_t p = 0; p < R; ++p) {
    if (in_sizes[p] > max_part) call.fail(oversized_part_message(int(p), in_sizes[p], max_part), true);
    const size_t out_n = int(p) == rank_ ? 0 : send[p].size();
    send_at[p + 1] = send_at[p] + out_n;
    recv_off[p + 1] = recv_off[p] + in_sizes[p];
  }
  std::vector<Bytes> recv(R);
  for (size_t p = 0; p < R; ++p) recv[p].resize(in_sizes[p]);
  recv[rank_] = send[rank_];
  if (send_at[R] == 0 && recv_off[R] == 0) return recv;
  const size_t base = align_up(send_at[R]);
  d = arena(call, base + recv_off[R]);
  for (size_t p = 0; p < R; ++p) {
    if (int(p) != rank_) call.h2d(d + send_at[p], send[p].data(), send[p].size());
  }
  call.nc(nccl_.GroupStart(), "ncclGroupStart");
  for (size_t p = 0; p < R; ++p) {
    if (int(p) == rank_) continue;
    const size_t out_n = send_at[p + 1] - send_at[p];
    if (out_n) {
      call.nc(nccl_.Send(reinterpret_cast<void*>(d + send_at[p]), out_n, ncclUint8, int(p), comm_, stream_),
              "ncclSend(payload)");
    }
    if (in_sizes[p]) {
      call.nc(nccl_.Recv(reinterpret_cast<void*>(d + base + recv_off[p]), in_sizes[p], ncclUint8,
                         int(p), comm_, stream_),
              "ncclRecv(payload)");
    }
  }
  call.nc(nccl_.GroupEnd(), "ncclGroupEnd");
  for (size_t p = 0; p < R; ++p) call.d2h(recv[p].data(), d + base + recv_off[p], in_sizes[p]);
  call.wait("alltoallv payloads");
  bytes_sent_ += send_at[R];
  return recv;
}

void NcclComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t nop = nccl_op(op);
  CC_CHECK(buf != nullptr || count == 0, kInvalidArgument, who(), ": allreduce of ", count,
           " elements from a null buffer");
  NcclCall call(*this, "allreduce");
  if (count == 0) return;
  const size_t bytes = count * dtype_size(dtype);
  const CUdeviceptr d = arena(call, bytes);
  call.h2d(d, buf, bytes);
  call.nc(nccl_.AllReduce(reinterpret_cast<void*>(d), reinterpret_cast<void*>(d), count, type, nop,
                          comm_, stream_),
          "ncclAllReduce");
  call.d2h(buf, d, bytes);
  call.wait("allreduce");
  bytes_sent_ += ring_allreduce_bytes(bytes, size_);
}

void NcclComm::broadcast(void* buf, size_t bytes, int root) {
  CC_CHECK(root >= 0 && root < size_, kInvalidArgument, who(), ": broadcast root ", root,
           " is not a rank of ", size_);
  CC_CHECK(buf != nullptr || bytes == 0, kInvalidArgument, who(), ": broadcast from a null buffer");
  NcclCall call(*this, "broadcast");
  if (bytes == 0) return;
  const CUdeviceptr d = arena(call, bytes);
  if (rank_ == root) call.h2d(d, buf, bytes);
  call.nc(nccl_.Broadcast(reinterpret_cast<void*>(d), reinterpret_cast<void*>(d), bytes, ncclUint8,
                          root, comm_, stream_),
          "ncclBroadcast");
  if (rank_ != root) call.d2h(buf, d, bytes);
  call.wait("broadcast");
  // A ring broadcast: every rank but the last one of the chain forwards.
  if ((root + size_ - 1) % size_ != rank_) bytes_sent_ += bytes;
}

void NcclComm::barrier() {
  NcclCall call(*this, "barrier");
  const CUdeviceptr d = arena(call, sizeof(int32_t));
  const int32_t one = 1;
  call.h2d(d, &one, sizeof one);
  call.nc(nccl_.AllReduce(reinterpret_cast<void*>(d), reinterpret_cast<void*>(d), 1, ncclInt32,
                          ncclSum, comm_, stream_),
          "ncclAllReduce(barrier)");
  call.wait("barrier");
  bytes_sent_ += ring_allreduce_bytes(sizeof(int32_t), size_);
}

void NcclComm::download(void* host, const void* device, size_t bytes) {
  NcclCall call(*this, "download");
  call.d2h(host, reinterpret_cast<CUdeviceptr>(device), bytes);
  call.wait("device-to-host copy");
}

void NcclComm::upload(void* device, const void* host, size_t bytes) {
  NcclCall call(*this, "upload");
  call.h2d(reinterpret_cast<CUdeviceptr>(device), host, bytes);
  call.wait("host-to-device copy");
}

}  // namespace compcoll::nccl
