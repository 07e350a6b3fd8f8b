// The projection's compute term, measured: one call of the real algorithm
// (the registry's, with the variant's sparse pattern pinned) on a SelfComm,
// the communicator of one rank whose collectives are the identity. Every
// pass the call makes over memory is in it: the encode with its accumulate
// and selection, the output's zero-fill, the decode and accumulate, csc's
// pack/unpack, onebit's two quantizations. auto times its compute the same
// way (collectives/auto.h). What grows with P beyond a rank of one is added
// in project_one() from the codec timings (project.h).
//
// `workers` processes run it at once, each on its own tensor and state, the
// way ranks sharing a machine's cores and memory bandwidth run it. Processes,
// not threads: a call allocates and frees tensor-sized buffers, and threads
// of one process fault those pages in under one address-space lock, which
// ranks (processes) do not share; onebit timed 3x slower on two threads than
// on two processes. A call's time is the slowest worker's (the benchmark
// reports the slowest rank), the result the median over iterations after the
// benchmark's one warm-up call (DGC's threshold adapts over the first calls;
// its later calls cost more than a first one on fresh state). The variants
// take turns call by call, as the benchmark's rows do: a burst of other work
// on the machine then slows all of them alike instead of one variant's
// whole series.
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <map>
#include <memory>
#include <vector>

#include "collectives/registry.h"
#include "collectives/self_comm.h"
#include "compcoll/error.h"
#include "integration/bench/gradients.h"
#include "integration/bench/process.h"
#include "integration/bench/project.h"

namespace compcoll::bench {
namespace {

constexpr int kWarmup = 1;  // as `compcoll-bench allreduce --warmup` defaults

AlgoParams pinned(const Variant& v, const AlgoParams& params) {
  AlgoParams p = params;
  if (v.pattern == "scatter") p.sparse_pattern = SparsePattern::kScatter;
  if (v.pattern == "allgather") p.sparse_pattern = SparsePattern::kAllgather;
  return p;
}

// Shared between the workers: a process-shared barrier and the timings.
struct Shared {
  pthread_barrier_t barrier;
  double times[1];  // [workers][variants][iters], allocated past the struct
};

// One worker (a forked child): never returns.
[[noreturn]] void worker(const std::vector<Variant>& vs, size_t count, const AlgoParams& params,
                         int w, int iters, Shared* shared) {
  const size_t nv = vs.size();
  try {
    const std::vector<float> grad = make_gradient(GradientKind::kGaussian, count, 1 + uint64_t(w));
    std::vector<float> buf(count);
    std::vector<std::unique_ptr<Algorithm>> algos;
    std::vector<std::unique_ptr<CodecState>> states;
    for (const Variant& v : vs) {
      algos.push_back(make_algorithm(v.algo, pinned(v, params)));
      states.push_back(algos.back()->make_state(count, 1));
    }
    SelfComm self;
    for (int it = -kWarmup; it < iters; ++it) {
      for (size_t i = 0; i < nv; ++i) {
        std::copy(grad.begin(), grad.end(), buf.begin());
        pthread_barrier_wait(&shared->barrier);  // all workers start each call together
        const auto t0 = std::chrono::steady_clock::now();
        algos[i]->allreduce(self, buf.data(), count, /*average=*/false, *states[i]);
        const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
        if (it >= 0) shared->times[(size_t(w) * nv + i) * size_t(iters) + size_t(it)] = dt.count();
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compcoll-bench project: timing the calls: %s\n", e.what());
    _exit(1);
  }
  _exit(0);
}

}  // namespace

std::map<std::string, double> measure_call_compute(const std::vector<Variant>& vs, size_t count,
                                                   const AlgoParams& params, int workers,
                                                   int iters) {
  CC_CHECK(workers >= 1 && iters >= 1, kInvalidArgument,
           "measure_call_compute: workers and iters must be >= 1");
  std::map<std::string, double> out;
  if (vs.empty()) return out;
  for (const Variant& v : vs) make_algorithm(v.algo, pinned(v, params));  // errors here, not in a child
  const size_t nv = vs.size();
  const size_t slots = size_t(workers) * nv * size_t(iters);
  const size_t bytes = sizeof(Shared) + sizeof(double) * slots;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CC_CHECK(mem != MAP_FAILED, kInternal, "project: cannot map ", bytes, " shared bytes");
  auto* shared = static_cast<Shared*>(mem);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, unsigned(workers));
  pthread_barrierattr_destroy(&attr);
  std::fflush(nullptr);  // the children must not flush the parent's buffers again

  std::vector<Child> children;
  bool ok = false;
  {
    ReapOnExit reap(children);  // an exception below leaves no worker behind
    for (int w = 0; w < workers; ++w) {
      // No terminating signal between fork() and watch_child(): the handler
      // would not know the new worker and leave it running.
      sigset_t block, old;
      sigemptyset(&block);
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
      pthread_sigmask(SIG_BLOCK, &block, &old);
      const pid_t pid = fork();
      if (pid == 0) {
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        worker(vs, count, params, w, iters, shared);
      }
      if (pid > 0) {
        Child c;
        c.pid = pid;
        c.rank = w;
        children.push_back(c);
        watch_child(pid);
      }
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      CC_CHECK(pid >= 0, kInternal, "project: fork failed");
    }
    // A worker that fails leaves the others at the barrier: wait_all kills
    // them after a second. The deadline bounds a hung one.
    ok = wait_all(children, std::chrono::steady_clock::now() + std::chrono::minutes(10),
                  std::chrono::seconds(1));
  }
  for (size_t i = 0; i < nv && ok; ++i) {
    std::vector<double> slowest(size_t(iters), 0.0);
    for (int w = 0; w < workers; ++w)
      for (int it = 0; it < iters; ++it)
        slowest[size_t(it)] = std::max(
            slowest[size_t(it)], shared->times[(size_t(w) * nv + i) * size_t(iters) + size_t(it)]);
    std::sort(slowest.begin(), slowest.end());
    const size_t m = slowest.size() / 2;
    out[vs[i].label()] = slowest.size() % 2 ? slowest[m] : 0.5 * (slowest[m - 1] + slowest[m]);
  }
  pthread_barrier_destroy(&shared->barrier);
  munmap(mem, bytes);
  CC_CHECK(ok, kInternal, "project: timing one call of each variant on ", workers,
           " processes failed (see the message above)");
  return out;
}

}  // namespace compcoll::bench
