// libcuda.so.1 stand-in: the driver entry points the NCCL interposer, NcclComm
// and the test program use, over host memory (see fake_cuda.h).
#include "tests/interposer/fake_cuda.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#define FAKE_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace fakecuda {
namespace {

// A queued task and the thread that enqueued it: each rank of a test is a
// thread with a "device" of its own (cuMemFree waits for its thread's work).
struct Queued {
  Task run;
  std::thread::id owner;
};

struct Engine {
  std::mutex mu;
  std::map<CUstream, std::deque<Queued>> queues;
  std::set<CUstream> capturing;
};

Engine& engine() {
  static Engine* e = new Engine();  // never destroyed: threads may outlive main
  return *e;
}

// Runs what can run on every stream. Caller holds the lock.
void progress_locked(Engine& e) {
  for (auto& [stream, q] : e.queues) {
    while (!q.empty() && q.front().run()) q.pop_front();
  }
}

bool drained(CUstream s) {
  Engine& e = engine();
  std::lock_guard<std::mutex> lk(e.mu);
  progress_locked(e);
  const auto it = e.queues.find(s);
  return it == e.queues.end() || it->second.empty();
}

struct FakeContext {
  int device;
};
FakeContext g_primary{0};
thread_local std::vector<CUcontext> t_ctx_stack;

CUcontext current() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

}  // namespace

void enqueue(CUstream stream, Task task) {
  Engine& e = engine();
  std::lock_guard<std::mutex> lk(e.mu);
  e.queues[stream].push_back({std::move(task), std::this_thread::get_id()});
}

}  // namespace fakecuda

using fakecuda::engine;

FAKE_CUDA_EXPORT CUresult cuInit(unsigned) { return CUDA_SUCCESS; }

FAKE_CUDA_EXPORT CUresult cuGetErrorString(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS: *s = "no error (fake)"; break;
    case CUDA_ERROR_NOT_READY: *s = "device not ready (fake)"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context (fake)"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory (fake)"; break;
    default: *s = "fake CUDA error"; break;
  }
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuDeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice) {
  *ctx = reinterpret_cast<CUcontext>(&fakecuda::g_primary);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (fakecuda::t_ctx_stack.empty()) fakecuda::t_ctx_stack.push_back(ctx);
  else fakecuda::t_ctx_stack.back() = ctx;
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = fakecuda::current();
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  if (fakecuda::current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *d = 0;
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {  // cuda.h maps it to _v2
  fakecuda::t_ctx_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuCtxPopCurrent(CUcontext* ctx) {
  if (fakecuda::t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = fakecuda::t_ctx_stack.back();
  fakecuda::t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuMemAlloc(CUdeviceptr* p, size_t bytes) {
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (m == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(m);
  return CUDA_SUCCESS;
}

// The real cuMemFree waits for the device's work, every stream's (a kernel
// that waits for a dead peer holds it for ever): modelled, with a 60 s
// limit, as the work the calling thread (one rank, one device) enqueued.
FAKE_CUDA_EXPORT CUresult cuMemFree(CUdeviceptr p) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const std::thread::id me = std::this_thread::get_id();
  for (;;) {
    bool idle = true;
    {
      fakecuda::Engine& e = engine();
      std::lock_guard<std::mutex> lk(e.mu);
      fakecuda::progress_locked(e);
      for (const auto& [stream, q] : e.queues) {
        for (const fakecuda::Queued& t : q) idle = idle && t.owner != me;
      }
    }
    if (idle) break;
    if (std::chrono::steady_clock::now() > deadline) return CUDA_ERROR_LAUNCH_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::free(reinterpret_cast<void*>(p));
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

// Pageable host memory: the source is staged at once, as the real driver does.
FAKE_CUDA_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
  fakecuda::enqueue(s, [dst, staged] {
    std::memcpy(reinterpret_cast<void*>(dst), staged->data(), staged->size());
    return true;
  });
  return CUDA_SUCCESS;
}

// Into pageable host memory (the only kind here) the real driver returns
// once the copy is done, so once the stream ahead of it is: modelled, with
// a 60 s limit where the real one has none.
FAKE_CUDA_EXPORT CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  fakecuda::enqueue(s, [dst, src, n] {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return true;
  });
  return cuStreamSynchronize(s);
}

FAKE_CUDA_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned) {
  *s = reinterpret_cast<CUstream>(new char[16]);  // a unique handle
  std::lock_guard<std::mutex> lk(engine().mu);
  engine().queues[*s];
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuStreamDestroy(CUstream s) {  // _v2
  {
    std::lock_guard<std::mutex> lk(engine().mu);
    engine().queues.erase(s);
  }
  delete[] reinterpret_cast<char*>(s);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuStreamQuery(CUstream s) {
  return fakecuda::drained(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_CUDA_EXPORT CUresult cuStreamSynchronize(CUstream s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fakecuda::drained(s)) {
    if (std::chrono::steady_clock::now() > deadline) return CUDA_ERROR_LAUNCH_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return CUDA_SUCCESS;
}

// Capture is only a flag here: work enqueued while capturing still runs
// (once), and launching the graph does nothing, which gives the same data.
FAKE_CUDA_EXPORT CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode) {  // _v2
  std::lock_guard<std::mutex> lk(engine().mu);
  engine().capturing.insert(s);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
  std::lock_guard<std::mutex> lk(engine().mu);
  engine().capturing.erase(s);
  *g = reinterpret_cast<CUgraph>(new char[16]);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lk(engine().mu);
  *status = engine().capturing.count(s) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph, unsigned long long) {
  *e = reinterpret_cast<CUgraphExec>(new char[16]);
  return CUDA_SUCCESS;
}

FAKE_CUDA_EXPORT CUresult cuGraphLaunch(CUgraphExec, CUstream) { return CUDA_SUCCESS; }
FAKE_CUDA_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  delete[] reinterpret_cast<char*>(e);
  return CUDA_SUCCESS;
}
FAKE_CUDA_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  delete[] reinterpret_cast<char*>(g);
  return CUDA_SUCCESS;
}
