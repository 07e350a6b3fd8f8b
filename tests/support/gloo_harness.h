// Multi-rank test harness: `world` ranks as threads of this process, joined
// over one in-memory gloo HashStore and real loopback (127.0.0.1) tcp
// sockets, each with its own GlooComm.
//
//   compcoll::testing::run_gloo_ranks(4, [](compcoll::Comm& comm) {
//     ... every rank runs this body; throw (or fail an EXPECT) on error ...
//   });
//
// run_gloo_ranks joins every rank and then rethrows, on the calling thread,
// the error that happened FIRST in time (later ones are usually peers timing
// out because of it), its message prefixed with "rank R of N: " and with the
// compcoll::Error kind kept. Nothing hangs: every collective is bounded by
// `timeout`, and a watchdog aborts the process (printing which ranks are
// stuck) if the bodies have not all returned after `watchdog`.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/comm.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace compcoll::testing {

struct HarnessOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};  // per call
  std::chrono::milliseconds watchdog{std::chrono::minutes(5)};  // whole run
  std::string hostname = "127.0.0.1";
  std::string prefix = "harness";
  // Shared store; a fresh HashStore when null.
  std::shared_ptr<gloo::rendezvous::Store> store;
};

using RankBody = std::function<void(Comm& comm)>;

// Runs body on every rank; rethrows the first rank error (see above).
void run_gloo_ranks(int world, const RankBody& body,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30));
void run_gloo_ranks(int world, const RankBody& body, const HarnessOptions& options);

// Same, but returns what each rank threw (null where it returned normally)
// instead of rethrowing: for fault tests where some ranks must fail.
// Failures of connect itself are reported the same way.
std::vector<std::exception_ptr> run_gloo_ranks_collect(
    int world, const RankBody& body, const HarnessOptions& options);

// The message of an exception_ptr ("" for null), for assertions.
std::string what(const std::exception_ptr& error);

}  // namespace compcoll::testing
