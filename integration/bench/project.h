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
//   compute  (C(v) / m + extra(v, P)) * s, measured at start
//            (project_compute.cc):
//            C(v)    one call of the variant's real algorithm on a SelfComm
//                    (the network replaced by the identity), the slowest of
//                    W processes running it at once, each on its own tensor,
//                    as ranks sharing cores and memory bandwidth run it:
//                    encode, zero-fill, decode + accumulate, allocation,
//                    whatever the algorithm does per call
//            m       max(1, W / this machine's cores): how many calls each
//                    core ran while C was timed, so C / m is one call's CPU
//                    time under that contention
//            extra   what a rank of P does beyond a rank of one, counted
//                    from the collectives and priced with the codec timings
//                    (`compcoll-bench codec`, one process alone) times f:
//                    allgather decodes P payloads instead of 1, + (P-1)
//                    decode; onebit quantizes the whole tensor once and its
//                    own shard (n/P) once into a fresh n/P-float sum, where
//                    a rank of one quantizes n twice into a fresh n-float
//                    sum, - (1 - 1/P) (encode + alloc), alloc = a fresh
//                    zeroed n-float buffer (page faults included); scatter
//                    and csc do the same work at any P (a rank reduces a
//                    region of n/P fed by P ranks' k/P entries)
//            (the sum is floored at C(v) / m / P: a rank of P still does
//            its share, and separately timed terms can be noisy)
//            f       the median over the variants of (C(v) / m) / C1(v),
//                    C1 timed with one process alone: how much slower the
//                    same work runs under the contention C was timed in
//                    (one factor for the machine, not one per variant: a
//                    ratio of two timings of a loaded machine is noisy)
//            s       max(1, P / cores) with cores > 0 (P ranks share the
//                    cores: each core runs s ranks' calls), else 1
//            A projection times C with W = min(ranks per host, cores here)
//            (a core per rank, the host's ranks computing at once). The
//            validation runs all P ranks on this machine's cores: it times
//            C with W = P (m = P / cores) right before each rank count's
//            runs, and s = P / cores, so its compute term is C itself (P
//            processes time-slicing the cores spend more CPU per call
//            than one per core; project_validate.cc).
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
//            Sharded (COMPCOLL_HIERARCHY=shards, "+shards"): each of a host's
//            N ranks owns a slice of n/N and runs the variant on it among
//            the P/N ranks of its index: the leaders' call with compute and
//            bytes divided by N (the codecs' work and k scale with n), all P
//            ranks computing at once (s = P / cores), the same bytes through
//            the host's port as one leader's but N times the messages in
//            each round ((N-1)(P/N-1) more, message_s each), and a local step
//            of 3 memcpy per rank (the copy in, the slice's sum of N parts of
//            n/N, the gather back), all of a host's ranks at once on its
//            memory bus, so times f. Not validated against a measured run:
//            --validate runs a rank per namespace (docs/scaling.md).
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
  // C(v) above, ms, by flat variant label ("dgc/scatter", "csc"), measured
  // at start with compute_workers threads at once.
  std::map<std::string, double> call_ms;
  std::map<std::string, double> call_alone_ms;  // C1(v), one process
  double alloc_ms = 0.0;    // a fresh zeroed buffer of count floats
  int compute_workers = 1;  // W
  double call_share = 1.0;  // m = max(1, W / cores of this machine)
  // When set (project --validate): alpha and alpha_ring measured on the
  // real run's communicator, as auto measures them, instead of the
  // latency / message terms above. beta stays the rate's. alpha_ring is a
  // ring allreduce of 2P floats, data in every one of Gloo's 2P segments, so
  // every rank sends and receives at each of the 2(P-1) steps, as in csc's
  // and dense's rings (measure_link(); a one-float probe moved one segment,
  // one message in flight, and priced csc's two rings far too low).
  std::optional<LinkModel> measured_latency;
};

// One algorithm with one way of moving its data.
struct Variant {
  std::string algo;     // registry name
  std::string pattern;  // "allgather" / "scatter" for dgc, sdagc, sbc; "" otherwise
  // COMPCOLL_HIERARCHY's mode: "off" (flat), "host" (this variant among the
  // host leaders) or "shards" (among the ranks of each local index, on a
  // slice each).
  std::string hierarchy = "off";
  bool flat() const { return hierarchy == "off"; }
  std::string label() const {
    return (pattern.empty() ? algo : algo + "/" + pattern) + (flat() ? "" : "+" + hierarchy);
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
// and each compressed one again under every hierarchy mode of `modes`
// other than "off" (off, host, shards; kInvalidArgument for another).
std::vector<Variant> variants_of(const std::vector<std::string>& algos,
                                 const std::vector<std::string>& modes = {"off"});

// The link model above for P ranks on `rate`.
LinkModel projected_link(const LinkRate& rate, int ranks, const ProjectionInputs& in);

Projection project_one(const Variant& v, int ranks, const LinkRate& rate, const ProjectionInputs& in);

// Measures every codec the variants need (encode/decode on in.count elements),
// a fresh buffer's allocation, and C1(v) and C(v) (in.compute_workers at
// once) of every flat compressed variant.
void measure_speeds(const std::vector<Variant>& variants, int iters, ProjectionInputs& in);

// f of the compute term above (1 when nothing was timed at once).
double contention(const ProjectionInputs& in);

// C1(v) (one process alone) of the flat compressed variants not timed yet,
// and C(v) with in.compute_workers at once of those not in in.call_ms.
void measure_calls(const std::vector<Variant>& variants, int iters, ProjectionInputs& in);

// This machine's cores (hardware threads).
int cores_here();

// C(v) of each variant (flat, compressed): per variant the median over
// iters of the slowest of `workers` processes, each running one call of
// the variant's algorithm on a SelfComm, the variants taking turns
// (project_compute.cc). By label.
std::map<std::string, double> measure_call_compute(const std::vector<Variant>& variants,
                                                   size_t count, const AlgoParams& params,
                                                   int workers, int iters);

int project_main(int argc, char** argv, int first);

// `project --validate`: runs `allreduce --link` at each rank count and prints
// projected against measured time per call and the error (project_validate.cc).
int validate_projection(const std::vector<Variant>& variants, const std::vector<int>& ranks,
                        const LinkRate& link, const ProjectionInputs& in, int iters, bool json,
                        const std::string& density_flag);

}  // namespace compcoll::bench
