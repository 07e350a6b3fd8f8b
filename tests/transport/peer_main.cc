// compcoll_transport_peer: one rank of a multi-process transport test.
//
//   compcoll_transport_peer --rank R --size N --rendezvous SPEC
//       [--prefix P] [--timeout-ms T] [--mode check|loop|join] [--iters K]
//
// Modes:
//   check  connect, run each collective once with known inputs and verify
//          the results; prints "OK rank R".
//   loop   connect, print "READY", then run K rounds of allreduce (64 Ki
//          floats) + allgatherv + barrier, printing nothing until it ends.
//          On an error prints "ERROR <kind>: <message>", then tries one more
//          call and prints "AFTER <kind>: <message>".
//   join   connect and exit.
//   announce-gib  (rank 1 of 2, a hostile peer) connect, then allgatherv a
//          1 GiB part (a reserved, never-written mapping) without a bound;
//          prints "ERROR <kind>: <message>" when the call fails.
// Exit status: 0 success, 2 a compcoll::Error of kind transport, 3 any
// other error, 4 bad command line. Output goes to stdout, flushed per line.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "transport/gloo_connect.h"

namespace {

using compcoll::Error;
using compcoll::ErrorKind;

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>(rank * 29 + i * 7 + (i >> 9));
}

void check_or_throw(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("wrong result: " + what);
}

void run_check(compcoll::Comm& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  // allgatherv with a zero-size part on rank 0.
  std::vector<uint8_t> mine(static_cast<size_t>(me) * 1000);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(me, i);
  const compcoll::Gathered g = comm.allgatherv(mine, compcoll::kUnboundedPart);
  check_or_throw(g.parts() == n, "allgatherv part count");
  for (int r = 0; r < n; ++r) {
    const auto part = g.part(r);
    check_or_throw(part.size() == static_cast<size_t>(r) * 1000, "allgatherv size");
    for (size_t i = 0; i < part.size(); ++i) {
      check_or_throw(part[i] == pattern(r, i), "allgatherv byte");
    }
  }
  // alltoallv
  std::vector<compcoll::Bytes> send(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) send[static_cast<size_t>(j)].assign(static_cast<size_t>(j + me), static_cast<uint8_t>(me * 16 + j));
  const auto got = comm.alltoallv(send, compcoll::kUnboundedPart);
  for (int i = 0; i < n; ++i) {
    check_or_throw(got[static_cast<size_t>(i)] ==
                       compcoll::Bytes(static_cast<size_t>(i + me), static_cast<uint8_t>(i * 16 + me)),
                   "alltoallv");
  }
  // allreduce
  std::vector<float> v(1000, static_cast<float>(me + 1));
  comm.allreduce(v.data(), v.size(), compcoll::DType::kFloat32, compcoll::ReduceOp::kSum);
  check_or_throw(v[999] == static_cast<float>(n * (n + 1) / 2), "allreduce");
  // broadcast
  std::vector<int> b(100, me == n - 1 ? 42 : -1);
  comm.broadcast(b.data(), b.size() * sizeof(int), n - 1);
  check_or_throw(b[0] == 42 && b[99] == 42, "broadcast");
  comm.barrier();
}

void run_loop(compcoll::Comm& comm, int iters) {
  say("READY");
  std::vector<float> v(64 * 1024);
  std::vector<uint8_t> mine(4096, static_cast<uint8_t>(comm.rank()));
  try {
    for (int it = 0; it < iters; ++it) {
      for (auto& x : v) x = 1.0f;
      comm.allreduce(v.data(), v.size(), compcoll::DType::kFloat32, compcoll::ReduceOp::kSum);
      comm.allgatherv(mine, compcoll::kUnboundedPart);
      comm.barrier();
    }
  } catch (const Error& e) {
    say(std::string("ERROR ") + compcoll::error_kind_name(e.kind()) + ": " + e.what());
    try {
      comm.barrier();
      say("AFTER no error");
    } catch (const Error& e2) {
      say(std::string("AFTER ") + compcoll::error_kind_name(e2.kind()) + ": " + e2.what());
    }
    throw;
  }
}

void run_announce_gib(compcoll::Comm& comm) {
  constexpr size_t kGiB = size_t{1} << 30;
  void* p = mmap(nullptr, kGiB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap of 1 GiB failed");
  try {
    comm.allgatherv({static_cast<const uint8_t*>(p), kGiB}, compcoll::kUnboundedPart);
  } catch (const Error& e) {
    say(std::string("ERROR ") + compcoll::error_kind_name(e.kind()) + ": " + e.what());
    munmap(p, kGiB);
    throw;
  }
  munmap(p, kGiB);
}

}  // namespace

int main(int argc, char** argv) {
  compcoll::GlooOptions o;
  o.hostname = "127.0.0.1";
  std::string mode = "check";
  int iters = 1000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--rank") o.rank = std::atoi(v.c_str());
    else if (k == "--size") o.size = std::atoi(v.c_str());
    else if (k == "--rendezvous") o.rendezvous = v;
    else if (k == "--prefix") o.prefix = v;
    else if (k == "--timeout-ms") o.timeout = std::chrono::milliseconds(std::atol(v.c_str()));
    else if (k == "--mode") mode = v;
    else if (k == "--iters") iters = std::atoi(v.c_str());
    else {
      say("usage error: unknown flag " + k);
      return 4;
    }
  }
  try {
    auto comm = compcoll::connect_gloo(o);
    if (mode == "check") {
      run_check(*comm);
      say("OK rank " + std::to_string(o.rank));
    } else if (mode == "loop") {
      run_loop(*comm, iters);
      say("DONE rank " + std::to_string(o.rank));
    } else if (mode == "announce-gib") {
      run_announce_gib(*comm);
      say("DONE rank " + std::to_string(o.rank));
    } else if (mode == "join") {
      say("JOINED rank " + std::to_string(o.rank));
    } else {
      say("usage error: unknown mode " + mode);
      return 4;
    }
    return 0;
  } catch (const Error& e) {
    if ((mode != "loop" && mode != "announce-gib") || e.kind() != ErrorKind::kTransport) {
      say(std::string("ERROR ") + compcoll::error_kind_name(e.kind()) + ": " + e.what());
    }
    return e.kind() == ErrorKind::kTransport ? 2 : 3;
  } catch (const std::exception& e) {
    say(std::string("ERROR other: ") + e.what());
    return 3;
  }
}
