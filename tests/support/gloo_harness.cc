#include "tests/support/gloo_harness.h"

#include <gloo/rendezvous/hash_store.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "compcoll/error.h"
#include "transport/gloo_connect.h"

namespace compcoll::testing {

namespace {

struct RankOutcome {
  std::exception_ptr error;
  uint64_t order = std::numeric_limits<uint64_t>::max();  // when it failed
  bool done = false;
};

// Re-creates `error` with "rank R of N: " in front, keeping the Error kind.
std::exception_ptr with_rank(const std::exception_ptr& error, int rank, int world) {
  const std::string prefix =
      "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return std::make_exception_ptr(Error(e.kind(), prefix + e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(std::runtime_error(prefix + e.what()));
  } catch (...) {
    return std::make_exception_ptr(
        std::runtime_error(prefix + "non-standard exception"));
  }
}

// Runs every rank; each outcome carries its (already rank-prefixed) error
// and when it happened relative to the other failures.
std::vector<RankOutcome> run_ranks(int world, const RankBody& body,
                                   const HarnessOptions& options) {
  CC_CHECK(world >= 1, kInvalidArgument, "run_gloo_ranks: world ", world,
           " must be >= 1");
  std::shared_ptr<gloo::rendezvous::Store> store =
      options.store ? options.store : std::make_shared<gloo::rendezvous::HashStore>();

  std::vector<RankOutcome> outcomes(static_cast<size_t>(world));
  std::atomic<uint64_t> failures{0};
  std::mutex m;
  std::condition_variable cv;
  int finished = 0;
  int connected = 0;  // ranks whose connect returned or threw

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RankOutcome& out = outcomes[static_cast<size_t>(rank)];
      try {
        GlooOptions o;
        o.rank = rank;
        o.size = world;
        o.store = store;
        o.hostname = options.hostname;
        o.timeout = options.timeout;
        o.prefix = options.prefix;
        std::unique_ptr<GlooComm> comm;
        std::exception_ptr connect_error;
        try {
          comm = connect_gloo(o);
        } catch (...) {
          connect_error = std::current_exception();
        }
        // No body before every rank's connect has ended: a rank whose body
        // makes no call on the world would otherwise close its pairs while a
        // peer's connect still waits on them ("Connection closed by peer").
        // Every connect ends by its timeout; past the watchdog the process
        // aborts (below) before this wait would end.
        {
          std::unique_lock<std::mutex> lock(m);
          ++connected;
          cv.notify_all();
          cv.wait_for(lock, options.watchdog, [&] { return connected == world; });
        }
        if (connect_error) std::rethrow_exception(connect_error);
        body(*comm);
      } catch (...) {
        out.order = failures.fetch_add(1);
        out.error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(m);
      out.done = true;
      ++finished;
      cv.notify_all();
    });
  }

  {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, options.watchdog, [&] { return finished == world; })) {
      std::string stuck;
      for (int r = 0; r < world; ++r) {
        if (!outcomes[static_cast<size_t>(r)].done) {
          stuck += ' ';
          stuck += std::to_string(r);
        }
      }
      std::fprintf(stderr,
                   "run_gloo_ranks: watchdog: rank(s)%s still running after %lld ms; "
                   "aborting instead of hanging\n",
                   stuck.c_str(), static_cast<long long>(options.watchdog.count()));
      std::fflush(stderr);
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    auto& out = outcomes[static_cast<size_t>(r)];
    if (out.error) out.error = with_rank(out.error, r, world);
  }
  return outcomes;
}

}  // namespace

std::vector<std::exception_ptr> run_gloo_ranks_collect(
    int world, const RankBody& body, const HarnessOptions& options) {
  std::vector<std::exception_ptr> errors;
  for (auto& out : run_ranks(world, body, options)) errors.push_back(out.error);
  return errors;
}

void run_gloo_ranks(int world, const RankBody& body, const HarnessOptions& options) {
  const std::vector<RankOutcome> outcomes = run_ranks(world, body, options);
  const RankOutcome* first = nullptr;
  for (const auto& out : outcomes) {
    if (out.error && (first == nullptr || out.order < first->order)) first = &out;
  }
  if (first != nullptr) std::rethrow_exception(first->error);
}

void run_gloo_ranks(int world, const RankBody& body,
                    std::chrono::milliseconds timeout) {
  HarnessOptions o;
  o.timeout = timeout;
  run_gloo_ranks(world, body, o);
}

std::string what(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "non-standard exception";
  }
}

}  // namespace compcoll::testing
