// Faults at the scale of this machine: 8 ranks as separate processes
// (compcoll_reliability_rank, rank_main.cc), 1000 back-to-back allreduces of
// random sizes (0 .. 2^20 elements, see workload.h) and random algorithms (every algorithm
// of the registry; the same sequence on every rank from a shared seed).
//
//   ThousandRandomCollectivesOnEightRankProcesses: all ranks finish, every
//     result is identical everywhere (dense: equal to the exact sum), and the
//     resident memory of every rank, sampled during the run, stays bounded.
//   RankKilledAtARandomPointFailsEverySurvivorInTime: one rank is SIGKILLed
//     at a random call (plus a random few milliseconds, so usually inside a
//     collective). Every survivor must fail with a kTransport error within
//     timeout + 2 s of the kill, exit, and leave no process behind; their
//     memory is sampled until then.
//
// Environment (for reduced runs, e.g. under sanitizers):
//   COMPCOLL_RELIABILITY_SEED    seed of the sequence, the victim and the
//                                kill point (default: random; printed)
//   COMPCOLL_RELIABILITY_CALLS   calls per run (default 1000)
//   COMPCOLL_RELIABILITY_TIMEOUT_MS  per-call timeout of the ranks (5000)
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/workload.h"
#include "tests/support/process_util.h"

namespace compcoll::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Under ASan the allocator keeps freed memory in a quarantine (256 MiB by
// default) and its own caches, so resident memory grows for reasons that are
// not ours; there the samples are printed but not bounded (LeakSanitizer
// checks every rank for leaks when it exits instead).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

const std::string kRankBinary = COMPCOLL_RELIABILITY_RANK;
constexpr int kWorld = 8;
constexpr long long kSlackMs = 2000;

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t test_seed() {
  const uint64_t s = env_u64("COMPCOLL_RELIABILITY_SEED", 0);
  return s ? s : (std::random_device{}() | 1);
}

long long mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// VmRSS of pid in KiB, or -1 once it is gone.
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// Samples the ranks' VmRSS every 250 ms on its own thread.
class RssSampler {
 public:
  explicit RssSampler(std::vector<pid_t> pids) : pids_(std::move(pids)), samples_(pids_.size()) {
    thread_ = std::thread([this] {
      while (!stop_) {
        {
          std::lock_guard<std::mutex> lock(m_);
          for (size_t r = 0; r < pids_.size(); ++r) {
            const long kib = rss_kib(pids_[r]);
            if (kib > 0) samples_[r].push_back(kib);
          }
        }
        for (int i = 0; i < 25 && !stop_; ++i) std::this_thread::sleep_for(milliseconds(10));
      }
    });
  }
  ~RssSampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::vector<long>> samples() {
    std::lock_guard<std::mutex> lock(m_);
    return samples_;
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<std::vector<long>> samples_;
  std::mutex m_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Prints every rank's samples in MiB (at most ~24 per rank, evenly spaced,
// last one included) and checks the bound: no rank above `cap_mib`, and no
// growth over the run: the peak of the second half is at most the peak of
// the first half + `growth_mib` (a leak of even a few KiB per call would
// show over 1000 calls of up to 4 MiB each).
void report_and_check_rss(const std::vector<std::vector<long>>& samples, const std::vector<int>& ranks,
                          long cap_mib, long growth_mib) {
  for (int r : ranks) {
    const auto& s = samples[static_cast<size_t>(r)];
    std::ostringstream os;
    os << "[ rss ] rank " << r << " (" << s.size() << " samples, MiB):";
    const size_t step = std::max<size_t>(1, s.size() / 24);
    for (size_t i = 0; i < s.size(); i += step) os << ' ' << s[i] / 1024;
    if (!s.empty() && (s.size() - 1) % step != 0) os << ' ' << s.back() / 1024;
    if (!s.empty()) {
      os << " | peak " << *std::max_element(s.begin(), s.end()) / 1024;
    }
    std::printf("%s\n", os.str().c_str());
    if (s.empty() || kSanitized) continue;
    const long peak = *std::max_element(s.begin(), s.end());
    EXPECT_LE(peak / 1024, cap_mib) << "rank " << r << " resident memory";
    if (s.size() >= 8) {
      const size_t half = s.size() / 2;
      const long first = *std::max_element(s.begin(), s.begin() + half);
      const long second = *std::max_element(s.begin() + half, s.end());
      EXPECT_LE((second - first) / 1024, growth_mib)
          << "rank " << r << ": resident memory grew from a first-half peak of " << first / 1024
          << " MiB to " << second / 1024 << " MiB";
    }
  }
  if (kSanitized) std::printf("[ rss ] sanitizer build: samples not bounded (allocator quarantine)\n");
  std::fflush(stdout);
}

struct Job {
  TempDir dir;
  ChildSet children;
  std::vector<pid_t> pids;
  std::string log(int r) const { return dir.path() + "/rank" + std::to_string(r) + ".log"; }
};

void start_ranks(Job& job, uint64_t seed, uint64_t calls, long long timeout_ms) {
  for (int r = 0; r < kWorld; ++r) {
    job.pids.push_back(job.children.add(spawn(
        {kRankBinary, "--rank", std::to_string(r), "--ranks", std::to_string(kWorld), "--rendezvous",
         "file://" + job.dir.path() + "/store", "--seed", std::to_string(seed), "--calls",
         std::to_string(calls), "--timeout-ms", std::to_string(timeout_ms)},
        job.log(r))));
  }
}

std::string tail_of(const std::string& text, size_t n = 1500) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

TEST(FaultsAtScale, ThousandRandomCollectivesOnEightRankProcesses) {
  const uint64_t seed = test_seed();
  const uint64_t calls = env_u64("COMPCOLL_RELIABILITY_CALLS", 1000);
  const long long timeout_ms = static_cast<long long>(env_u64("COMPCOLL_RELIABILITY_TIMEOUT_MS", 5000));
  std::printf("[ seed ] COMPCOLL_RELIABILITY_SEED=%llu, %llu calls, 8 ranks\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(calls));
  Job job;
  const auto t0 = Clock::now();
  start_ranks(job, seed, calls, timeout_ms);
  RssSampler rss(job.pids);

  // Bounded: every rank must be done within 5 minutes.
  const auto deadline = t0 + milliseconds(300000);
  std::vector<int> code(kWorld, -1000);
  for (int r = 0; r < kWorld; ++r) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    const auto status = job.children.wait(job.pids[r], std::max(left, milliseconds(1)));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " still running after 300 s: "
                                    << tail_of(read_file(job.log(r)));
    code[r] = exit_code(*status);
  }
  rss.stop();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ time ] %llu collectives on 8 rank processes: %.1f s (%.1f ms per call)\n",
              static_cast<unsigned long long>(calls), secs, 1000.0 * secs / double(calls));
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = read_file(job.log(r));
    EXPECT_EQ(code[r], 0) << "rank " << r << ": " << tail_of(out);
    EXPECT_NE(out.find("done " + std::to_string(calls) + "\n"), std::string::npos)
        << "rank " << r << ": " << tail_of(out);
  }
  std::vector<int> all(kWorld);
  for (int r = 0; r < kWorld; ++r) all[r] = r;
  report_and_check_rss(rss.samples(), all, /*cap_mib=*/512, /*growth_mib=*/48);
}

TEST(FaultsAtScale, RankKilledAtARandomPointFailsEverySurvivorInTime) {
  const uint64_t seed = test_seed();
  const uint64_t calls = env_u64("COMPCOLL_RELIABILITY_CALLS", 1000);
  const long long timeout_ms = static_cast<long long>(env_u64("COMPCOLL_RELIABILITY_TIMEOUT_MS", 5000));
  reliability::Rng rng(seed ^ 0x5EEDull);
  const int victim = static_cast<int>(rng.below(kWorld));
  const uint64_t kill_call = 1 + rng.below(calls - 1);  // in [1, calls)
  const int delay_ms = static_cast<int>(rng.below(30));
  std::printf("[ seed ] COMPCOLL_RELIABILITY_SEED=%llu: rank %d is killed %d ms into call %llu of %llu\n",
              static_cast<unsigned long long>(seed), victim, delay_ms,
              static_cast<unsigned long long>(kill_call), static_cast<unsigned long long>(calls));
  Job job;
  start_ranks(job, seed, calls, timeout_ms);
  RssSampler rss(job.pids);

  ASSERT_TRUE(wait_for_text(job.log(victim), "call " + std::to_string(kill_call) + " ", milliseconds(300000)))
      << "rank " << victim << " never reached call " << kill_call << ": " << tail_of(read_file(job.log(victim)));
  std::this_thread::sleep_for(milliseconds(delay_ms));
  ASSERT_EQ(kill(job.pids[victim], SIGKILL), 0);
  const auto killed_at = Clock::now();
  const long long killed_ns = mono_ns();

  // Poll every survivor's exit (5 ms resolution) until timeout + slack, and
  // one more second to see the ones that are late.
  const auto limit = milliseconds(timeout_ms + kSlackMs);
  std::vector<double> exit_ms(kWorld, -1.0);
  std::vector<int> code(kWorld, -1000);
  int running = kWorld;
  while (running > 0 && Clock::now() - killed_at < limit + milliseconds(1000)) {
    for (int r = 0; r < kWorld; ++r) {
      if (exit_ms[r] >= 0) continue;
      if (auto st = job.children.wait(job.pids[r], milliseconds(0))) {
        exit_ms[r] = std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count();
        code[r] = exit_code(*st);
        --running;
      }
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  rss.stop();
  const std::vector<pid_t> left = job.children.alive();
  job.children.kill_all();  // whatever is still there (a failure below)

  EXPECT_EQ(code[victim], -SIGKILL);
  std::vector<int> survivors;
  std::vector<double> error_ms;
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    survivors.push_back(r);
    const std::string out = read_file(job.log(r));
    ASSERT_GE(exit_ms[r], 0.0) << "rank " << r << " still running " << limit.count() + 1000
                               << " ms after the kill: " << tail_of(out);
    EXPECT_EQ(code[r], 3) << "rank " << r << " must fail with a transport error: " << tail_of(out);
    EXPECT_LE(exit_ms[r], double(limit.count())) << "rank " << r << " exited late";
    const size_t at = out.find("mono_ns ");
    ASSERT_NE(at, std::string::npos) << "rank " << r << ": " << tail_of(out);
    const long long err_ns = std::atoll(out.c_str() + at + 8);
    error_ms.push_back(double(err_ns - killed_ns) / 1e6);
    std::printf("[ fail ] rank %d: error %.0f ms after the kill, exit %.0f ms: %s", r, error_ms.back(),
                exit_ms[r], out.substr(out.rfind("error call")).c_str());
  }
  // Every rank was reaped above (alive() lists the ones that were not).
  EXPECT_TRUE(left.empty()) << left.size() << " rank process(es) were still running";
  if (!error_ms.empty()) {
    std::printf("[ fail ] survivors' error latency after the kill: min %.0f ms, max %.0f ms (limit %lld ms)\n",
                *std::min_element(error_ms.begin(), error_ms.end()),
                *std::max_element(error_ms.begin(), error_ms.end()), static_cast<long long>(limit.count()));
  }
  report_and_check_rss(rss.samples(), survivors, /*cap_mib=*/512, /*growth_mib=*/48);
}

}  // namespace
}  // namespace compcoll::testing
