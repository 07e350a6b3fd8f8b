// `compcoll-bench allreduce`: R local ranks (processes), dense vs compressed
// algorithms, nccl-tests-style table or JSON (DESIGN.md's CLI contract).
// `compcoll-bench worker` is the per-rank side it spawns.
#pragma once

namespace compcoll::bench {

int allreduce_main(int argc, char** argv, int first);
int worker_main(int argc, char** argv, int first);

}  // namespace compcoll::bench
