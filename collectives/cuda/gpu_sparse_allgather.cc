#include "collectives/cuda/gpu_sparse_allgather.h"

#include <cuda_runtime.h>

#include <mutex>

#include "collectives/registry.h"
#include "collectives/sparse_allgather.h"
#include "compcoll/error.h"
#include "compression/cuda/cuda_util.h"
#include "compression/cuda/decode_gpu.h"
#include "compression/cuda/elementwise.h"
#include "compression/cuda/gpu_state.h"
#include "compression/cuda/sparse_gpu.h"
#include "compression/decode.h"
#include "compression/payload.h"

namespace compcoll::cuda {
namespace {

// Whether the calling thread has a CUDA context current. cudaGetDevice says
// 0 on a thread that never chose a device, and cudaSetDevice(0) there would
// create device 0's primary context (hundreds of MB of its memory) in a
// process that may never use device 0: only a thread that had a context is
// switched back. Asked of the driver (cuCtxGetCurrent) through the runtime's
// entry-point query, so that this library needs no link to libcuda.
bool thread_has_context() {
  using CtxGetCurrent = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)
  static const CtxGetCurrent get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuCtxGetCurrent", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return CtxGetCurrent{nullptr};
    }
    return reinterpret_cast<CtxGetCurrent>(fn);
  }();
  void* ctx = nullptr;
  // Unknown: assume a context, as before (switching back is then right).
  return get == nullptr || (get(&ctx) == 0 && ctx != nullptr);
}

// A tensor's error-feedback state while the device route runs it.
class GpuResidency final : public DeviceResidency {
 public:
  GpuResidency(GpuState state, int device) : state_(std::move(state)), device_(device) {}
  size_t size() const override { return state_.n; }
  size_t memory_bytes() const override { return state_.memory_bytes(); }
  uint64_t steps() const override { return state_.steps; }
  void to_host(CodecState& host) override {
    // Whoever asks (a checkpoint at ncclCommDestroy, at exit) may have
    // another device current: switch to the state's for the copy and back.
    int previous = -1;
    if (!thread_has_context() || cudaGetDevice(&previous) != cudaSuccess) {
      cudaGetLastError();
      previous = -1;
    }
    if (previous != device_) check(cudaSetDevice(device_), "cudaSetDevice");
    // Every call of the route ended with its stream drained, so the state
    // is complete: the default stream may read it.
    host.v.resize(state_.n);
    state_.to_host(host, nullptr);
    if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  }
  GpuState& state() { return state_; }
  int device() const { return device_; }

 private:
  GpuState state_;
  int device_;
};

// The calling thread's current device (the context NCCL's caller runs
// in), or -1.
int current_device() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

// The device holding p, or -1 when p is not device (or managed) memory.
int device_of(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for whoever asks next
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

class GpuSparseAllgather final : public DeviceRoute {
 public:
  GpuSparseAllgather(std::string name, std::unique_ptr<SparseCodecGpu> codec)
      : name_(std::move(name)), codec_(std::move(codec)) {}

  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  std::string refuses(const void* send, const void* recv, size_t count, DType dtype) const override {
    (void)count;
    if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
      return compcoll::detail::concat("dtype ", dtype_name(dtype), " has no GPU codec");
    }
    const int d = device_of(recv);
    if (d < 0) return "the output buffer is not device memory";
    if (device_of(send) != d) return "the input buffer is not device memory on the output's device";
    // The route runs in the caller's context and never switches it.
    if (current_device() != d) {
      return compcoll::detail::concat("the buffers are on device ", d,
                                      ", the calling thread's current device is ",
                                      current_device());
    }
    return {};
  }

  CallInfo allreduce(Comm& comm, const void* send, void* recv, size_t n, DType dtype, bool average,
                     CodecState& state) override {
    std::lock_guard<std::mutex> lock(mu_);  // one stream and scratch per route
    const int device = device_of(recv);
    CC_CHECK(device >= 0 && device == current_device(), kInternal, name_,
             " on the device: a call refuses() would stage (output on device ", device,
             ", current device ", current_device(), ")");
    if (state.device == nullptr) {
      // The tensor's first call here (or the first since a host call): its
      // state moves to the device, and the host copy is released.
      auto moved = std::make_unique<GpuResidency>(GpuState::from_host(state, stream_), device);
      state.device = std::move(moved);
      std::vector<float>().swap(state.v);
      std::vector<float>().swap(state.u);
    }
    auto& residency = static_cast<GpuResidency&>(*state.device);
    CC_CHECK_EQ(residency.device(), device, kInvalidArgument, name_,
                ": this tensor's error-feedback state is on device ", residency.device(),
                ", its buffer on device ", device);
    const bool wide = dtype == DType::kFloat32;
    const bool bf16 = dtype == DType::kBFloat16;
    const float* grad = static_cast<const float*>(send);
    float* out = static_cast<float*>(recv);
    if (!wide) {
      // fp16/bf16: an fp32 copy, the residual stays fp32 (as on the host).
      wide_.resize(n);
      widen_gpu(send, wide_.data(), n, bf16, stream_);
      grad = out = wide_.data();
    }
    Bytes payload;
    const EncodeInfo info = codec_->encode(grad, n, residency.state(), payload, stream_);
    const Gathered all = comm.allgatherv(payload, max_payload_bytes(n));
    CC_CHECK_EQ(all.parts(), comm.size(), kInternal, "allgatherv returned the wrong number of parts");
    // The encode has read the gradient: the output (send's own memory when
    // in place) is zeroed for the ranks' payloads, decoded in rank order.
    check(cudaMemsetAsync(out, 0, n * sizeof(float), stream_), "cudaMemsetAsync");
    for (int r = 0; r < all.parts(); ++r) {
      try {
        decoder_.accumulate(all.part(r), out, n, stream_);
      } catch (const Error& e) {
        reject_peer_payload(name_.c_str(), comm, r, e);
      }
    }
    if (average) scale_gpu(out, n, 1.0f / static_cast<float>(comm.size()), stream_);
    if (!wide) narrow_gpu(out, recv, n, bf16, stream_);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return CallInfo{payload.size(), info.sent};
  }

 private:
  std::string name_;
  std::unique_ptr<SparseCodecGpu> codec_;
  GpuDecoder decoder_;
  DeviceBuffer<float> wide_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
};

}  // namespace

GpuRouteChoice make_gpu_sparse_route(std::string_view algo, const AlgoParams& params) {
  GpuRouteChoice out;
  const std::optional<SparseCodecConfig> c = sparse_codec_config(algo, params);
  if (!c) {
    out.why = compcoll::detail::concat(algo, " has no GPU codec (dgc, sdagc and sbc have)");
    return out;
  }
  const float beta = algo == "dgc" ? c->dgc.second_moment_beta
                     : algo == "sdagc" ? c->sdagc.second_moment_beta
                                       : c->sbc.second_moment_beta;
  if (beta > 0.0f) {
    out.why = "normalized selection (COMPCOLL_SELECTION) has no GPU kernel";
    return out;
  }
  if (algo == "sbc" && c->sbc.momentum != 0.0f) {
    out.why = "sbc's momentum correction (COMPCOLL_MOMENTUM) has no GPU kernel";
    return out;
  }
  std::string missing;
  if (!device_available(&missing)) {
    out.why = compcoll::detail::concat("no CUDA device for the GPU codecs (", missing, ")");
    return out;
  }
  std::unique_ptr<SparseCodecGpu> codec;
  if (algo == "dgc") {
    codec = std::make_unique<DgcCodecGpu>(c->dgc);
  } else if (algo == "sdagc") {
    codec = std::make_unique<SdagcCodecGpu>(c->sdagc);
  } else {
    codec = std::make_unique<SbcCodecGpu>(c->sbc);
  }
  out.route = std::make_unique<GpuSparseAllgather>(std::string(algo), std::move(codec));
  return out;
}

}  // namespace compcoll::cuda
