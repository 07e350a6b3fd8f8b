// NcclComm: the Comm seam over an existing NCCL communicator.
//
// Terms:
//   host API   the Comm seam passes host memory; every call stages it through
//              one device arena (grown on demand, freed with the NcclComm):
//              copy in, NCCL collective in place, copy out.
//   stream     calls are enqueued on stream() (the caller's stream when the
//              interposer sets it, else a stream of our own) and every call
//              returns only once that stream has drained, so ordering with
//              the caller's earlier and later work is the stream's.
//   deadline   each call must finish within timeout() of its start: we poll
//              cuStreamQuery and ncclCommGetAsyncError (which also resolves
//              ncclInProgress of non-blocking communicators) until it passes.
//   abort      on a timeout or an asynchronous NCCL error the communicator is
//              aborted (ncclCommAbort: the only way to stop kernels stuck
//              waiting for a peer) and the call throws Error(kTransport).
//              The ncclComm_t is then gone: aborted() tells its owner not to
//              destroy it again. Every later call throws kTransport too.
//
// How each collective maps onto NCCL:
//   allgatherv  ncclAllGather of the u64 sizes, then ncclAllGather of every
//               payload padded to the largest (NCCL has no allgatherv).
//   alltoallv   grouped ncclSend/ncclRecv of the u64 sizes, then of the
//               payloads (empty ones skipped: both sides know the size).
//   allreduce   ncclAllReduce (kAvg is the collectives' job: rejected).
//   broadcast   ncclBroadcast of bytes.  barrier: allreduce of one int.
//
// Argument errors are detected before any traffic, throw kInvalidArgument
// and leave the communicator usable. One thread uses a NcclComm at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "collectives/comm.h"
#include "transport/nccl/nccl_api.h"

namespace compcoll::nccl {

class NcclCall;  // one call's bookkeeping (nccl_comm.cc)

struct NcclCommOptions {
  std::chrono::milliseconds timeout{30000};
  // Stream to run on; null: create one (non-blocking) on the comm's device.
  CUstream stream = nullptr;
  // When set and true, a call's waits end at their next poll as a timeout
  // would: the call aborts the communicator and fails. The owner sets it to
  // abort a communicator a call of another thread may be waiting on (the
  // NCCL interposer, when its program calls ncclCommAbort). Must outlive
  // the NcclComm.
  const std::atomic<bool>* stop = nullptr;
};

class NcclComm final : public Comm {
 public:
  // nccl and cuda must outlive the NcclComm; comm is not owned (not
  // destroyed here), but it is aborted on timeout.
  NcclComm(const NcclApi& nccl, const CudaDriverApi& cuda, ncclComm_t comm,
           NcclCommOptions options = {});
  ~NcclComm() override;

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override;
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

  // What NCCL's ring algorithms put on the wire for this rank: blocks
  // per allgather, 2(R-1)/R of the buffer per allreduce, the payloads of
  // alltoallv. Padding of allgatherv counts: it is sent.
  uint64_t bytes_sent() const override { return bytes_sent_; }

  // Device <-> host copies on stream(), bounded by the timeout (the
  // interposer stages the caller's device buffers with these).
  void download(void* host, const void* device, size_t bytes);
  void upload(void* device, const void* host, size_t bytes);

  // Waits, by the polled wait with its deadline, for the work already on
  // stream() (the caller's, ahead of a call): code about to wait on the
  // stream without a deadline (cudaStreamSynchronize in the GPU codecs)
  // calls this first, so a caller's kernel stuck on a dead peer becomes a
  // timeout naming `what` instead of a hang.
  void drain(const char* what);

  CUstream stream() const { return stream_; }
  void set_stream(CUstream s) { stream_ = s; }
  ncclComm_t handle() const { return comm_; }
  int device() const { return device_; }
  bool broken() const { return !broken_.empty(); }
  bool aborted() const { return aborted_; }

  // "rank R/N" prefix used in every message.
  std::string who() const;

 private:
  friend class NcclCall;

  // The staging arena, at least `bytes`; growing it first drains the stream
  // by call's polled wait (freeing waits for the device's work).
  CUdeviceptr arena(NcclCall& call, size_t bytes);
  void release_arena();

  const NcclApi& nccl_;
  const CudaDriverApi& cuda_;
  ncclComm_t comm_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  CUcontext ctx_ = nullptr;  // the comm's device's primary context, when we needed it
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>* stop_ = nullptr;
  CUstream stream_ = nullptr;
  CUstream own_stream_ = nullptr;
  CUdeviceptr arena_ = 0;
  size_t arena_bytes_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t calls_ = 0;
  std::string broken_;
  bool aborted_ = false;
};

}  // namespace compcoll::nccl
