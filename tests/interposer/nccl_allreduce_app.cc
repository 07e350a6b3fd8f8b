// An ordinary NCCL program: the "unmodified application" of the interposer
// tests. It knows nothing of compcoll. Ranks are threads, one communicator
// each (ncclCommInitRank); buffers are device memory (cuMemAlloc); work goes
// on a stream. It links against libnccl.so.2 and libcuda.so.1: the stand-ins
// on CPU-only machines (tests/interposer), the real ones on a GPU
// (tests/gpu, one rank per GPU).
//
// It runs a fixed sequence: fp32/fp16/bf16 SUM/AVG allreduces of --count
// elements (what compression may take), then calls that must reach NCCL
// untouched (int32 SUM, fp32 MAX, a 100-element SUM, an allreduce inside
// ncclGroupStart/End, one captured into a CUDA graph), other collectives
// (broadcast, allgather), and with --split the same buffer through a parent
// and a split child. --fp32-avg adds an out-of-place fp32 AVG (b -> c, whose
// input must stay as it was). --first-step N starts the fp32 steps' data at step N,
// as a run resumed from a checkpoint would. --loss-scale S trains as under a
// loss scaler (torch.amp.GradScaler): the fp32 steps' gradients are S times
// the data, their results are recorded divided by S (so the digests compare
// with a run without one), and the interposer is told as compcoll's Python
// package would tell it (compcoll_nccl_note_loss_scaled at the start,
// compcoll_nccl_loss_scale_changed(0.5) where --halve-at K halves S before
// step K; found with dlsym (include/compcoll/nccl_interposer.h), as the
// package finds them, and not called with
// --no-tell). --overflow-at K: rank 1's fp32 gradient at step K is all
// infinite, a step the scaler skips (its result is not recorded);
// --skip-step K leaves step K's fp32 call out altogether. Every allreduce prints its
// arguments:
//   compressible|forwarded count=N type=T op=O root=0 send=P recv=P stream=S
// in the stand-in NCCL's log format, digests of the results ("digest NAME HEX",
// checked equal on every rank), and finally "result ok" (exit 0) or
// "result FAIL ..." (exit 1). Forwarded calls are always checked against a
// reference; compressible ones only with --exact (no compression).
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "compcoll/nccl_interposer.h"
#include "compression/half.h"

namespace {

struct Options {
  int ranks = 2;
  size_t count = 20000;
  int steps = 3;
  int first_step = 0;  // the fp32 steps' data continue from here (a resumed run)
  bool split = false;
  bool child_idle = false;
  int stall_rank = -1;
  bool stall_forwarded = false;  // the stalled call is one the interposer forwards
  bool exact = false;
  bool reduce_scatter = false;  // other_collectives also runs a reduce-scatter of count elements
  bool expect_init_failure = false;
  bool no_destroy = false;  // leave the communicators to process exit
  bool fp32_avg = false;    // one more fp32 call: AVG, out of place (b -> c)
  float loss_scale = 0.0f;  // > 0: --loss-scale
  int halve_at = -1;
  int overflow_at = -1;
  int skip_step = -1;
  bool tell = true;         // call the interposer's compcoll_nccl_* entries
  bool nonblocking = false; // ncclCommInitRankConfig with blocking = 0, polled until ready
};

struct Shared {
  Options o;
  ncclUniqueId id;
  std::mutex mu;
  // Every rank's thread waits here for the others (bounded).
  std::condition_variable arrived;
  int waiting = 0;
  uint64_t generation = 0;
  void barrier() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t g = generation;
    if (++waiting == o.ranks) {
      waiting = 0;
      ++generation;
      arrived.notify_all();
      return;
    }
    if (!arrived.wait_for(lk, std::chrono::seconds(60), [&] { return generation != g; })) {
      throw std::runtime_error("a rank did not reach the barrier within 60 s");
    }
  }
  std::map<std::string, std::map<int, uint64_t>> digests;  // name -> rank -> digest
  std::vector<std::string> failures;
  std::atomic<int> reported{0};  // stall mode: ranks that saw their error
  std::atomic<int> aborted{0};   // stall mode: ranks whose ncclCommAbort returned

  void print(const std::string& line) {
    std::lock_guard<std::mutex> lk(mu);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  void fail(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    failures.push_back("rank " + std::to_string(rank) + ": " + why);
  }
};

float value(int rank, int salt, size_t i) {
  uint64_t x = (uint64_t(rank) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(salt) << 32) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return float(int64_t(x % 2000001) - 1000000) * 1e-6f;  // in [-1, 1]
}

uint64_t digest(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

class Rank {
 public:
  Rank(Shared& sh, int rank) : sh_(sh), o_(sh.o), rank_(rank) {}

  void run() {
    CUdevice dev;
    CUcontext ctx;
    int devices = 0;
    cu(cuDeviceGetCount(&devices), "cuDeviceGetCount");
    cu(cuDeviceGet(&dev, rank_ % std::max(devices, 1)), "cuDeviceGet");
    cu(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    cu(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    cu(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    const ncclResult_t init = o_.nonblocking ? init_nonblocking() : ncclCommInitRank(&comm_, o_.ranks, sh_.id, rank_);
    if (o_.expect_init_failure) {
      if (init == ncclSuccess) throw std::runtime_error("ncclCommInitRank succeeded; a failure was expected");
      sh_.print("init-failed rank " + std::to_string(rank_) + " result " + std::to_string(int(init)) +
                " " + ncclGetLastError(nullptr));
      return;
    }
    nc(init, "ncclCommInitRank");
    const size_t n = o_.count;
    a_ = alloc(n * 4);
    b_ = alloc(n * 4);
    c_ = alloc(n * 4);
    if (compressible_phase()) {  // false: stall mode ended the run
      forwarded_phase();
      other_collectives();
      if (o_.split) split_phase();
      if (!o_.no_destroy) nc(ncclCommDestroy(comm_), "ncclCommDestroy");
    }
    for (CUdeviceptr p : {a_, b_, c_}) cuMemFree(p);
  }

 private:
  // A non-blocking communicator, polled until it is ready as NCCL's
  // documentation asks before it is used (bounded: 60 s).
  ncclResult_t init_nonblocking() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, o_.ranks, sh_.id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) return r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the communicator never became ready");
      if (const ncclResult_t q = ncclCommGetAsyncError(comm_, &r); q != ncclSuccess) return q;
    } while (r == ncclInProgress);
    return r;
  }
  static void cu(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(int(r)));
  }
  void nc(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) {
      throw std::runtime_error(std::string(what) + " failed: " + ncclGetErrorString(r) + " / " + ncclGetLastError(comm_));
    }
  }
  CUdeviceptr alloc(size_t bytes) {
    CUdeviceptr p;
    cu(cuMemAlloc(&p, bytes), "cuMemAlloc");
    return p;
  }
  void sync() { cu(cuStreamSynchronize(s_), "cuStreamSynchronize"); }
  template <typename T>
  void put(CUdeviceptr d, const std::vector<T>& h) { cu(cuMemcpyHtoD(d, h.data(), h.size() * sizeof(T)), "cuMemcpyHtoD"); }
  template <typename T>
  std::vector<T> get(CUdeviceptr d, size_t n) {
    std::vector<T> h(n);
    cu(cuMemcpyDtoH(h.data(), d, n * sizeof(T)), "cuMemcpyDtoH");
    return h;
  }

  ncclResult_t allreduce(const char* tag, CUdeviceptr send, CUdeviceptr recv, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm) {
    char line[256];
    std::snprintf(line, sizeof line, "%s count=%zu type=%d op=%d root=0 send=%p recv=%p stream=%p", tag,
                  count, int(type), int(op), reinterpret_cast<void*>(send), reinterpret_cast<void*>(recv),
                  static_cast<void*>(s_));
    sh_.print(line);
    return ncclAllReduce(reinterpret_cast<void*>(send), reinterpret_cast<void*>(recv), count, type, op,
                         comm, s_);
  }
  void record(const std::string& name, const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(sh_.mu);
    sh_.digests[name][rank_] = digest(p, bytes);
  }
  // |got - want| within tol of the sum of magnitudes (the sum's order differs between NCCLs).
  void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& scale, float tol) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(got[i] - want[i]) <= tol * scale[i] + 1e-30f)) {
        throw std::runtime_error(std::string(what) + ": element " + std::to_string(i) + " is " +
                                 std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
      }
    }
  }
  // Reference SUM (or AVG) of value(r, salt, i) over ranks.
  void reference(int salt, size_t n, bool avg, std::vector<float>& want, std::vector<float>& scale) {
    want.assign(n, 0.0f);
    scale.assign(n, 0.0f);
    for (int r = 0; r < o_.ranks; ++r) {
      for (size_t i = 0; i < n; ++i) {
        want[i] += value(r, salt, i);
        scale[i] += std::fabs(value(r, salt, i));
      }
    }
    if (avg) for (float& w : want) w /= float(o_.ranks);
  }

  bool compressible_phase() {
    const size_t n = o_.count;
    std::vector<float> h(n), want, scale;
    for (int step = o_.first_step; step < o_.first_step + o_.steps; ++step) {
      if (o_.stall_rank >= 0 && step == o_.first_step + 1) return stall();
      if (step == o_.skip_step) continue;
      const float s = loss_scale_at(step);
      for (size_t i = 0; i < n; ++i) h[i] = value(rank_, step, i) * s;
      if (step == o_.overflow_at && rank_ == 1) std::fill(h.begin(), h.end(), INFINITY);
      put(a_, h);
      nc(allreduce("compressible", a_, a_, n, ncclFloat32, ncclSum, comm_), "ncclAllReduce(fp32)");
      sync();
      auto got = get<float>(a_, n);
      if (step == o_.overflow_at) {
        if (std::isfinite(got[0])) throw std::runtime_error("an overflowed step's result is finite");
        continue;  // the scaler skips it
      }
      for (float& x : got) x /= s;  // exact: s is a power of two
      record("fp32-sum-" + std::to_string(step), got.data(), n * 4);
      for (float x : got) {
        if (!std::isfinite(x)) throw std::runtime_error("fp32 allreduce produced a non-finite value");
      }
      if (o_.exact) {
        reference(step, n, false, want, scale);
        expect_close("fp32 sum", got, want, scale, 1e-5f);
      }
    }
    if (o_.fp32_avg) {
      const int salt = 300;
      for (size_t i = 0; i < n; ++i) h[i] = value(rank_, salt, i);
      put(b_, h);
      nc(allreduce("compressible", b_, c_, n, ncclFloat32, ncclAvg, comm_), "ncclAllReduce(fp32 avg)");
      sync();
      const auto got = get<float>(c_, n);
      record("fp32-avg-out-of-place", got.data(), n * 4);
      if (got != get<float>(c_, n) || get<float>(b_, n) != h) {
        throw std::runtime_error("fp32 avg: the input buffer changed or the output is unstable");
      }
      if (o_.exact) {
        reference(salt, n, true, want, scale);
        expect_close("fp32 avg", got, want, scale, 1e-5f);
      }
    }
    half_call(ncclFloat16, ncclSum, "fp16-sum", compcoll::float_to_half, compcoll::half_to_float);
    half_call(ncclBfloat16, ncclAvg, "bf16-avg", compcoll::float_to_bf16, compcoll::bf16_to_float);
    return true;
  }

  // The loss scale of a step: --loss-scale, halved from --halve-at on. The
  // ranks are threads of one process, so one of them tells the interposer,
  // between two barriers: in a program of one rank per process each tells
  // its own, between two steps, as GradScaler.update() does.
  float loss_scale_at(int step) {
    if (o_.loss_scale <= 0.0f) return 1.0f;
    if (o_.halve_at < 0 || step < o_.halve_at) return o_.loss_scale;
    if (step == o_.halve_at) {
      sh_.barrier();
      if (rank_ == 0 && o_.tell) tell_scale_changed(0.5);
      sh_.barrier();
    }
    return o_.loss_scale * 0.5f;
  }
  static void tell_scale_changed(double factor) {
    auto fn = reinterpret_cast<compcoll_nccl_loss_scale_changed_fn>(
        dlsym(RTLD_DEFAULT, COMPCOLL_NCCL_LOSS_SCALE_CHANGED));
    size_t rescaled = 0;
    if (fn != nullptr && fn(factor, &rescaled) != 0) {
      throw std::runtime_error(std::string("compcoll_nccl_loss_scale_changed failed: ") +
                               ncclGetLastError(nullptr));
    }
    std::printf("loss-scale-changed found=%d rescaled=%zu\n", fn != nullptr, rescaled);
  }

  void half_call(ncclDataType_t type, ncclRedOp_t op, const char* name, uint16_t (*to)(float),
                 float (*from)(uint16_t)) {
    const size_t n = o_.count;
    const int salt = type == ncclFloat16 ? 100 : 101;
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = to(value(rank_, salt, i));
    put(a_, h);
    nc(allreduce("compressible", a_, a_, n, type, op, comm_), name);
    sync();
    const auto got16 = get<uint16_t>(a_, n);
    record(name, got16.data(), n * 2);
    if (!o_.exact) return;
    std::vector<float> got(n), want(n, 0.0f), scale(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      got[i] = from(got16[i]);
      for (int r = 0; r < o_.ranks; ++r) {
        want[i] += from(to(value(r, salt, i)));
        scale[i] += std::fabs(value(r, salt, i));
      }
      if (op == ncclAvg) want[i] /= float(o_.ranks);
    }
    expect_close(name, got, want, scale, 1e-2f);
  }

  // This rank skips the call the others make, so theirs cannot complete.
  bool stall() {
    if (rank_ == o_.stall_rank) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      // After the others' aborts: a dead peer would never abort, so theirs
      // must not depend on this one's.
      while (sh_.aborted < o_.ranks - 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else {
      ncclResult_t r = ncclSuccess;
      if (o_.stall_forwarded) {
        // Enqueued and left hanging on the stream: the kernel never ends
        // until the communicator is aborted.
        put(a_, std::vector<int32_t>(o_.count, 1));
        r = allreduce("forwarded", a_, a_, o_.count, ncclInt32, ncclSum, comm_);
      } else {
        put(a_, std::vector<float>(o_.count, 1.0f));
        r = allreduce("compressible", a_, a_, o_.count, ncclFloat32, ncclSum, comm_);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      sh_.print("stall-error rank " + std::to_string(rank_) + " result " + std::to_string(int(r)) +
                " async " + std::to_string(int(async)) + " " + ncclGetLastError(comm_));
      ++sh_.reported;
    }
    nc(ncclCommAbort(comm_), "ncclCommAbort");
    if (rank_ != o_.stall_rank) ++sh_.aborted;
    return false;
  }

  void forwarded_phase() {
    const size_t n = o_.count;
    std::vector<int32_t> hi(n);
    for (size_t i = 0; i < n; ++i) hi[i] = (rank_ + 1) * int32_t(i % 7);
    put(a_, hi);
    nc(allreduce("forwarded", a_, a_, n, ncclInt32, ncclSum, comm_), "ncclAllReduce(int32)");
    sync();
    const auto goti = get<int32_t>(a_, n);
    const int32_t ranksum = o_.ranks * (o_.ranks + 1) / 2;
    for (size_t i = 0; i < n; ++i) {
      if (goti[i] != ranksum * int32_t(i % 7)) throw std::runtime_error("int32 sum is wrong at " + std::to_string(i));
    }
    std::vector<float> h(n), want, scale;
    for (size_t i = 0; i < n; ++i) h[i] = value(rank_, 200, i);
    put(b_, h);
    nc(allreduce("forwarded", b_, c_, n, ncclFloat32, ncclMax, comm_), "ncclAllReduce(max)");
    sync();
    const auto gotmax = get<float>(c_, n);
    for (size_t i = 0; i < n; ++i) {
      float m = value(0, 200, i);
      for (int r = 1; r < o_.ranks; ++r) m = std::max(m, value(r, 200, i));
      if (gotmax[i] != m) throw std::runtime_error("fp32 max is wrong at " + std::to_string(i));
    }
    // float64 SUM: a gradient-like sum that compcoll does not compress.
    const CUdeviceptr d = alloc(n * sizeof(double));
    std::vector<double> hd(n);
    for (size_t i = 0; i < n; ++i) hd[i] = double(value(rank_, 204, i));
    put(d, hd);
    nc(allreduce("forwarded", d, d, n, ncclFloat64, ncclSum, comm_), "ncclAllReduce(float64)");
    sync();
    const auto gotd = get<double>(d, n);
    cuMemFree(d);
    for (size_t i = 0; i < n; ++i) {
      double want = 0.0;
      for (int r = 0; r < o_.ranks; ++r) want += double(value(r, 204, i));
      if (gotd[i] != want) throw std::runtime_error("float64 sum is wrong at " + std::to_string(i));
    }
    plain_sum("forwarded", 100, 201, a_, false, false);   // smaller than COMPCOLL_MIN_ELEMS
    plain_sum("forwarded", n, 202, b_, true, false);      // inside a group
    plain_sum("forwarded", n, 203, c_, false, true);      // captured into a graph
  }

  void plain_sum(const char* tag, size_t n, int salt, CUdeviceptr d, bool group, bool capture) {
    std::vector<float> h(n), want, scale;
    for (size_t i = 0; i < n; ++i) h[i] = value(rank_, salt, i);
    put(d, h);
    CUgraph graph = nullptr;
    if (group) nc(ncclGroupStart(), "ncclGroupStart");
    if (capture) cu(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
    nc(allreduce(tag, d, d, n, ncclFloat32, ncclSum, comm_), "ncclAllReduce(sum)");
    if (group) nc(ncclGroupEnd(), "ncclGroupEnd");
    if (capture) {
      CUgraphExec exec;
      cu(cuStreamEndCapture(s_, &graph), "cuStreamEndCapture");
      cu(cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
      cu(cuGraphLaunch(exec, s_), "cuGraphLaunch");
      sync();
      cuGraphExecDestroy(exec);
      cuGraphDestroy(graph);
    }
    sync();
    reference(salt, n, false, want, scale);
    expect_close(group ? "grouped sum" : capture ? "captured sum" : "small sum", get<float>(d, n), want, scale, 1e-5f);
  }

  void other_collectives() {
    const size_t n = 1000;
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(rank_, 300, i);
    put(a_, h);
    nc(ncclBroadcast(reinterpret_cast<void*>(a_), reinterpret_cast<void*>(a_), n, ncclFloat32, 0, comm_, s_),
       "ncclBroadcast");
    put(b_, h);
    nc(ncclAllGather(reinterpret_cast<void*>(b_), reinterpret_cast<void*>(c_), n, ncclFloat32, comm_, s_),
       "ncclAllGather");
    sync();
    const auto bc = get<float>(a_, n);
    const auto ag = get<float>(c_, n * o_.ranks);
    for (size_t i = 0; i < n; ++i) {
      if (bc[i] != value(0, 300, i)) throw std::runtime_error("broadcast is wrong");
      for (int r = 0; r < o_.ranks; ++r) {
        if (ag[r * n + i] != value(r, 300, i)) throw std::runtime_error("allgather is wrong");
      }
    }
    if (o_.reduce_scatter) reduce_scatter_phase();
  }

  // A reduce-scatter of count float sums (sharded training's gradients):
  // forwarded, and exact.
  void reduce_scatter_phase() {
    const size_t per_rank = o_.count / static_cast<size_t>(o_.ranks);
    const size_t n = per_rank * static_cast<size_t>(o_.ranks);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((rank_ + 1) * ((i % 97) + 1));
    put(a_, h);
    nc(ncclReduceScatter(reinterpret_cast<void*>(a_), reinterpret_cast<void*>(b_), per_rank,
                         ncclFloat32, ncclSum, comm_, s_),
       "ncclReduceScatter");
    sync();
    const auto got = get<float>(b_, per_rank);
    const int rank_sum = o_.ranks * (o_.ranks + 1) / 2;
    for (size_t i = 0; i < per_rank; ++i) {
      const size_t at = static_cast<size_t>(rank_) * per_rank + i;
      if (got[i] != static_cast<float>(rank_sum * static_cast<int>((at % 97) + 1))) {
        throw std::runtime_error("reduce-scatter is wrong");
      }
    }
  }

  // The same device buffer through the parent and a split child: with
  // per-communicator state, the parent's results cannot depend on the child.
  void split_phase() {
    ncclComm_t child = nullptr;
    nc(ncclCommSplit(comm_, 0, rank_, &child, nullptr), "ncclCommSplit");
    const size_t n = o_.count;
    std::vector<float> h(n);
    for (int step = 0; step < o_.steps; ++step) {
      for (size_t i = 0; i < n; ++i) h[i] = value(rank_, 400 + step, i);
      put(a_, h);
      nc(allreduce("compressible", a_, a_, n, ncclFloat32, ncclSum, comm_), "parent allreduce");
      sync();
      const auto got = get<float>(a_, n);
      record("split-parent-" + std::to_string(step), got.data(), n * 4);
      if (o_.child_idle) continue;
      for (size_t i = 0; i < n; ++i) h[i] = 10.0f * value(rank_, 500 + step, i);
      put(a_, h);
      nc(allreduce("compressible", a_, a_, n, ncclFloat32, ncclSum, child), "child allreduce");
      sync();
      const auto gotc = get<float>(a_, n);
      record("split-child-" + std::to_string(step), gotc.data(), n * 4);
    }
    if (!o_.no_destroy) nc(ncclCommDestroy(child), "ncclCommDestroy(child)");
  }

  Shared& sh_;
  const Options& o_;
  int rank_;
  CUstream s_ = nullptr;
  ncclComm_t comm_ = nullptr;
  CUdeviceptr a_ = 0, b_ = 0, c_ = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--ranks") o.ranks = std::stoi(next());
    else if (a == "--count") o.count = std::stoul(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--first-step") o.first_step = std::stoi(next());
    else if (a == "--split") o.split = true;
    else if (a == "--child-idle") o.child_idle = true;
    else if (a == "--stall-rank") o.stall_rank = std::stoi(next());
    else if (a == "--stall-forwarded") o.stall_forwarded = true;
    else if (a == "--exact") o.exact = true;
    else if (a == "--reduce-scatter") o.reduce_scatter = true;
    else if (a == "--fp32-avg") o.fp32_avg = true;
    else if (a == "--expect-init-failure") o.expect_init_failure = true;
    else if (a == "--no-destroy") o.no_destroy = true;
    else if (a == "--loss-scale") o.loss_scale = std::stof(next());
    else if (a == "--halve-at") o.halve_at = std::stoi(next());
    else if (a == "--overflow-at") o.overflow_at = std::stoi(next());
    else if (a == "--skip-step") o.skip_step = std::stoi(next());
    else if (a == "--no-tell") o.tell = false;
    else if (a == "--nonblocking") o.nonblocking = true;
    else throw std::runtime_error("unknown argument " + a);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Shared sh;
  try {
    sh.o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::printf("result FAIL %s\n", e.what());
    return 2;
  }
  if (cuInit(0) != CUDA_SUCCESS || ncclGetUniqueId(&sh.id) != ncclSuccess) {
    std::printf("result FAIL cannot initialise CUDA or NCCL\n");
    return 1;
  }
  if (sh.o.loss_scale > 0.0f && sh.o.tell) {
    // GradScaler's first scale() call, before any communicator exists.
    auto noted = reinterpret_cast<compcoll_nccl_note_loss_scaled_fn>(
        dlsym(RTLD_DEFAULT, COMPCOLL_NCCL_NOTE_LOSS_SCALED));
    std::printf("note-loss-scaled found=%d\n", noted != nullptr);
    if (noted != nullptr && noted() != 0) {
      std::printf("result FAIL compcoll_nccl_note_loss_scaled: %s\n", ncclGetLastError(nullptr));
      return 1;
    }
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < sh.o.ranks; ++r) {
    threads.emplace_back([&sh, r] {
      try {
        Rank(sh, r).run();
      } catch (const std::exception& e) {
        sh.fail(r, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& [name, per_rank] : sh.digests) {
    bool same = true;
    for (const auto& [r, d] : per_rank) same = same && d == per_rank.begin()->second;
    std::printf("digest %s %016llx%s\n", name.c_str(), static_cast<unsigned long long>(per_rank.begin()->second),
                same ? "" : " DIFFERS-ACROSS-RANKS");
    if (!same) sh.failures.push_back("ranks disagree on " + name);
  }
  if (!sh.failures.empty()) {
    for (const auto& f : sh.failures) std::printf("result FAIL %s\n", f.c_str());
    return 1;
  }
  std::printf("result ok\n");
  return 0;
}
