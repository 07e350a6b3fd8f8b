#include "compression/cuda/gpu_state.h"

namespace compcoll::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) CC_THROW(kInternal, "CUDA error in ", what, ": ", cudaGetErrorString(e));
}

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error for whoever asks next
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device is present";
    return false;
  }
  return true;
}

GpuState GpuState::zeros(size_t n, bool with_momentum, cudaStream_t s) {
  GpuState st;
  st.n = n;
  st.v.resize(n);
  if (n) check(cudaMemsetAsync(st.v.data(), 0, n * sizeof(float), s), "cudaMemsetAsync");
  if (with_momentum) {
    st.u.resize(n);
    if (n) check(cudaMemsetAsync(st.u.data(), 0, n * sizeof(float), s), "cudaMemsetAsync");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return st;
}

GpuState GpuState::from_host(const CodecState& host, cudaStream_t s) {
  GpuState st;
  st.n = host.size();
  st.v.resize(st.n);
  to_device(st.v.data(), host.v.data(), st.n, s);
  if (!host.u.empty()) {
    st.u.resize(host.u.size());
    to_device(st.u.data(), host.u.data(), host.u.size(), s);
  }
  st.steps = host.steps;
  st.lambda = host.lambda;
  return st;
}

void GpuState::to_host(CodecState& host, cudaStream_t s) const {
  CC_CHECK_EQ(host.size(), n, kInvalidArgument, "GpuState::to_host: the host state has another size");
  cuda::to_host(host.v.data(), v.data(), n, s);
  host.u.resize(u.size());
  cuda::to_host(host.u.data(), u.data(), u.size(), s);
  host.steps = steps;
  host.lambda = lambda;
}

}  // namespace compcoll::cuda
