// `compcoll-bench project`: time per call beyond this machine (rank counts
// and links it cannot run), from auto's cost model (collectives/auto.h) fed
// with codec speeds measured here at start. One model: the communication
// term is predict_seconds(cost shape, link) and the sparse patterns' shapes
// are sparse_pattern_cost(), exactly what `auto` and COMPCOLL_SPARSE_PATTERN
// =auto decide with; this file only supplies the inputs:
//
//   link     beta  = 8 / (rate * goodput)   s per byte, goodput = TCP payload
//                                           per Ethernet frame (1448 / 1514)
//            alpha = latency + (P-1) * msg  one round of P-1 direct messages
//                                           (allgatherv/alltoallv post one
//                                           send per peer)
//            alpha_ring = 2 (P-1) latency   a ring allreduce's dependent steps
//   compute  encode + decodes(P) * decode of the real codec on N elements
//            (as `compcoll-bench codec` times them): decodes = P for the
//            allgather pattern (every payload), 2 for scatter (the owners'
//            parts, then the result), 2 for onebit (the shard sums, then the
//            gathered shards), 1 for csc; dense has none in the model.
//            With cores > 0 (the validation on this machine, where P ranks
//            share the cores) compute is multiplied by max(1, P / cores).
//   time     compute + predict_seconds(shape, link); dense uses one ring
//            latency, as AutoAllreduce::predict_dense does.
//   hosts    with ranks_per_host N > 1 the N ranks of a host share its port.
//            Flat variants: a ring (dense, csc) crosses each host boundary
//            once, so the port carries one rank's bytes; the direct-message
//            patterns (sparse, onebit) carry what all N ranks send to the
//            P-N ranks elsewhere: wire_bytes * N (P-N)/(P-1). Hierarchical
//            variants (COMPCOLL_HIERARCHY=host, label "+host"): the same
//            variant among the P/N leaders, plus the local steps, which move
//            memory: (N+1) memcpy of the tensor (each rank's copy in, the
//            leader's N-1 additions, the copy out), memcpy timed at start.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/auto.h"
#include "integration/bench/codec_bench.h"
#include "integration/bench/netns.h"

namespace compcoll::bench {

struct ProjectionInputs {
  size_t count = 0;
  AlgoParams params;
  double latency_s = 50e-6;      // one message's one-way latency
  double message_s = 2e-6;       // sender cost of each further message in a round
  double goodput = 1448.0 / 1514.0;
  int cores = 0;                 // 0: every rank has its own core
  int ranks_per_host = 1;        // N ranks share one host port (and memory)
  std::map<std::string, CodecSpeed> speeds;  // by codec name, measured at start
  // When set (project --validate): alpha and alpha_ring measured on the
  // real run's communicator, as auto measures them, instead of the
  // latency / message terms above. beta stays the rate's.
  std::optional<LinkModel> measured_latency;
};

// One algorithm with one way of moving its data.
struct Variant {
  std::string algo;     // registry name
  std::string pattern;  // "allgather" / "scatter" for dgc, sdagc, sbc; "" otherwise
  bool hierarchical = false;  // the host hierarchy: this variant among the host leaders
  std::string label() const {
    return (pattern.empty() ? algo : algo + "/" + pattern) + (hierarchical ? "+host" : "");
  }
};

struct Projection {
  Variant variant;
  int ranks = 0;
  LinkRate link;
  double compute_s = 0.0;
  double comm_s = 0.0;
  double wire_bytes = 0.0;  // sent per rank per call (the cost shape's)
  int rounds = 0;
  double time_s() const { return compute_s + comm_s; }
};

// The variants of these algorithms: every pattern each sparse one supports,
// and with hierarchy each compressed one again under the host hierarchy.
std::vector<Variant> variants_of(const std::vector<std::string>& algos, bool hierarchy = false);

// The link model above for P ranks on `rate`.
LinkModel projected_link(const LinkRate& rate, int ranks, const ProjectionInputs& in);

Projection project_one(const Variant& v, int ranks, const LinkRate& rate, const ProjectionInputs& in);

// Measures every codec the variants need (encode/decode on in.count elements).
void measure_speeds(const std::vector<Variant>& variants, int iters, ProjectionInputs& in);

int project_main(int argc, char** argv, int first);

// `project --validate`: runs `allreduce --link` at each rank count and prints
// projected against measured time per call and the error (project_validate.cc).
int validate_projection(const std::vector<Variant>& variants, const std::vector<int>& ranks,
                        const LinkRate& link, const ProjectionInputs& in, int iters, bool json,
                        const std::string& density_flag);

}  // namespace compcoll::bench
