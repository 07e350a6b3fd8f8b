// compcoll-bench: the standalone benchmark (DESIGN.md, "Benchmark CLI
// contract"). Subcommands:
//   codec      one codec on one thread, against memcpy of the same buffer
//   allreduce  R local ranks, dense vs compressed algorithms
//   project    time per call at any scale, from the cost model (project.h)
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "compcoll/error.h"
#include "integration/bench/allreduce_bench.h"
#include "integration/bench/codec_bench.h"
#include "integration/bench/project.h"

namespace {

void usage() {
  std::puts(
      "usage: compcoll-bench <subcommand> [flags]   (--help after a subcommand lists its flags,\n"
      "       with their defaults)\n"
      "  codec      [--algo A] [--count N] [--density D] [--json]\n"
      "  allreduce  [--ranks R] [--algo A[,B...]] [--count N | --sizes S[,S...]] [--iters K]\n"
      "             [--link RATE] [--json]\n"
      "  project    [--ranks 4,16,...] [--link 1gbit,...] [--count N] [--plot PNG] [--validate]\n"
      "             [--json]\n"
      "a first look, in seconds: compcoll-bench allreduce --ranks 2 --sizes 1M");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  try {
    if (sub == "codec") return compcoll::bench::codec_main(argc, argv, 2);
    if (sub == "allreduce") return compcoll::bench::allreduce_main(argc, argv, 2);
    if (sub == "project") return compcoll::bench::project_main(argc, argv, 2);
    if (sub == "worker") return compcoll::bench::worker_main(argc, argv, 2);
    std::fprintf(stderr, "compcoll-bench: unknown subcommand '%s'\n", sub.c_str());
    usage();
    return 2;
  } catch (const std::exception& e) {
    // compcoll's errors carry a "compcoll: " prefix for library users; the
    // tool's own prefix replaces it rather than doubling it.
    const std::string msg = compcoll::message_without_prefix(e);
    std::fprintf(stderr, "compcoll-bench %s: %s\n", sub.c_str(), msg.c_str());
    return 1;
  }
}
