// The algorithm descriptor table: the single source of truth for which
// algorithms exist, what they are, and how to build one. Selection
// (COMPCOLL_ALGO), compcoll-info, the benchmark and the tests all read it.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "collectives/algorithm.h"

namespace compcoll {

struct AlgorithmDescriptor {
  const char* name;
  const char* description;
  std::unique_ptr<Algorithm> (*make)(const AlgoParams& params);
};

std::span<const AlgorithmDescriptor> algorithm_table();

// Throws kInvalidArgument naming the value and the registered names.
const AlgorithmDescriptor& find_algorithm(std::string_view name);
std::unique_ptr<Algorithm> make_algorithm(std::string_view name, const AlgoParams& params);

// The codec behind a sparse-allgather algorithm (dgc, sbc, sdagc), built
// from the same parameters; null for the others.
std::unique_ptr<SparseCodec> make_sparse_codec(std::string_view name, const AlgoParams& params);

// The density `algo` runs at: p.density, or for kAutoDensity a byte
// budget. dgc and sdagc (and auto weighing them) send as many entries as
// DGC's 0.1 % costs at 8 bytes an entry (fp32 value, u32 index): 0.001 at
// fp32 + u32, 0.00133 with one field compact, 0.002 at fp16 + varint (~4
// bytes), about 0.0036 at the default fp8 + rice (~2.25 bytes). Measured
// on the convergence suite (docs/convergence.md, "Spending the whole
// budget"): against 0.002, 0.0036 lowered cnn's training loss after the
// warm-up for both, over 15 seeds, and lm's held-out loss on every seed,
// at 224-240x where DGC's 0.001 at fp32 + u32 gives 250x. sbc's entry (a
// sign bit and a Rice-coded position, ~1.4 bytes) stays far under the
// budget; its density weighs its accuracy against its ratio
// (docs/convergence.md, "sbc's density").
double density_for(std::string_view algo, const AlgoParams& p);

// Whether COMPCOLL_SELECTION changes what `algo` sends: dgc and sdagc rank
// their residual, sbc only over its exact warm-up, auto through the
// algorithm it weighs (p.auto_algo); csc, onebit and dense rank none.
bool ranks_a_residual(std::string_view algo, const AlgoParams& p);

// "dense, dgc, sbc, sdagc, csc, onebit"
std::string algorithm_names();

}  // namespace compcoll
