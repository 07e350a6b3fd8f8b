// Host-side helpers of the CUDA codecs: error checks that throw
// compcoll::Error, and a growable device buffer. Plain C++ over the CUDA
// runtime API (cuda_runtime_api.h), so host orchestration files build with
// the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compcoll/error.h"

namespace compcoll::cuda {

// Throws Error(kInternal) "CUDA error in <what>: <message>".
void check(cudaError_t e, const char* what);

// A device array that only grows: resize() keeps the allocation when it is
// large enough and does not preserve contents.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void resize(size_t n) {
    if (n > capacity_) {
      release();
      void* p = nullptr;
      check(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), "cudaMalloc");
      p_ = static_cast<T*>(p);
      capacity_ = n;
    }
    size_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  void release() {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    capacity_ = size_ = 0;
  }
  void swap(DeviceBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(capacity_, o.capacity_);
    std::swap(size_, o.size_);
  }
  T* p_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

// Synchronous copies on `stream` (they wait for the stream).
template <typename T>
void to_device(T* dst, const T* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync(H2D)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}
template <typename T>
void to_host(T* dst, const T* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(D2H)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}
template <typename T>
std::vector<T> to_host(const T* src, size_t n, cudaStream_t s) {
  std::vector<T> out(n);
  to_host(out.data(), src, n, s);
  return out;
}
template <typename T>
T read_one(const T* src, cudaStream_t s) {
  T x{};
  to_host(&x, src, 1, s);
  return x;
}

// Whether a CUDA device is usable here (false, with the reason, when the
// driver, the device or the runtime is missing).
bool device_available(std::string* why = nullptr);

}  // namespace compcoll::cuda
