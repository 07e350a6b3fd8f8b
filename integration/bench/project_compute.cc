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
// its later calls cost more than a first one on fresh state).
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
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

// Shared between the workers: a process-shared barrier and the timings.
struct Shared {
  pthread_barrier_t barrier;
  double times[1];  // [workers * iters], allocated past the struct
};

// One worker (a forked child): never returns.
[[noreturn]] void worker(const Variant& v, size_t count, const AlgoParams& p, int w, int iters,
                         Shared* shared) {
  try {
    const std::vector<float> grad = make_gradient(GradientKind::kGaussian, count, 1 + uint64_t(w));
    std::vector<float> buf(count);
    auto algo = make_algorithm(v.algo, p);
    auto state = algo->make_state(count, 1);
    SelfComm self;
    for (int it = -kWarmup; it < iters; ++it) {
      std::copy(grad.begin(), grad.end(), buf.begin());
      pthread_barrier_wait(&shared->barrier);  // all workers start each call together
      const auto t0 = std::chrono::steady_clock::now();
      algo->allreduce(self, buf.data(), count, /*average=*/false, *state);
      const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
      if (it >= 0) shared->times[size_t(w) * size_t(iters) + size_t(it)] = dt.count();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compcoll-bench project: timing %s: %s\n", v.label().c_str(), e.what());
    _exit(1);
  }
  _exit(0);
}

}  // namespace

double measure_call_compute(const Variant& v, size_t count, const AlgoParams& params, int workers,
                            int iters) {
  CC_CHECK(workers >= 1 && iters >= 1, kInvalidArgument,
           "measure_call_compute: workers and iters must be >= 1");
  AlgoParams p = params;
  if (v.pattern == "scatter") p.sparse_pattern = SparsePattern::kScatter;
  if (v.pattern == "allgather") p.sparse_pattern = SparsePattern::kAllgather;
  make_algorithm(v.algo, p);  // a bad configuration fails here, not in the children

  const size_t bytes = sizeof(Shared) + sizeof(double) * size_t(workers) * size_t(iters);
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
  ReapOnExit reap(children);  // an exception below leaves no worker behind
  for (int w = 0; w < workers; ++w) {
    const pid_t pid = fork();
    CC_CHECK(pid >= 0, kInternal, "project: fork failed");
    if (pid == 0) worker(v, count, p, w, iters, shared);
    Child c;
    c.pid = pid;
    c.rank = w;
    children.push_back(c);
    watch_child(pid);
  }
  // A worker that fails leaves the others at the barrier: wait_all kills
  // them after a second. The deadline bounds a hung one.
  const bool ok = wait_all(children, std::chrono::steady_clock::now() + std::chrono::minutes(5),
                           std::chrono::seconds(1));
  std::vector<double> slowest(size_t(iters), 0.0);
  for (int w = 0; w < workers; ++w)
    for (int it = 0; it < iters; ++it)
      slowest[size_t(it)] =
          std::max(slowest[size_t(it)], shared->times[size_t(w) * size_t(iters) + size_t(it)]);
  pthread_barrier_destroy(&shared->barrier);
  munmap(mem, bytes);
  CC_CHECK(ok, kInternal, "project: timing one call of ", v.label(), " on ", workers,
           " processes failed (see the message above)");
  std::sort(slowest.begin(), slowest.end());
  const size_t m = slowest.size() / 2;
  return slowest.size() % 2 ? slowest[m] : 0.5 * (slowest[m - 1] + slowest[m]);
}

}  // namespace compcoll::bench
