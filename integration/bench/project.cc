#include "integration/bench/project.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "collectives/dense.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "compression/codec.h"
#include "compression/payload.h"
#include "integration/bench/args.h"
#include "integration/bench/json.h"
#include "integration/bench/process.h"
#include "plugin/config.h"

namespace compcoll::bench {
namespace {

bool is_sparse(const std::string& algo) { return algo == "dgc" || algo == "sdagc" || algo == "sbc"; }

// extra(v, P) of project.h: what a rank of P computes beyond the rank of one
// that C(v) timed, in ms.
double extra_compute_ms(const Variant& v, int ranks, const ProjectionInputs& in) {
  const CodecSpeed& s = in.speeds.at(v.algo);
  if (v.pattern == "allgather") return double(ranks - 1) * s.decode_ms;
  if (v.algo == "onebit") return -(1.0 - 1.0 / double(ranks)) * (s.encode_ms + in.alloc_ms);
  return 0.0;
}

std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  for (const auto& item : split_list(s)) {
    const long long r = parse_count("--ranks", item);
    CC_CHECK(r >= 2 && r <= (1 << 20), kInvalidArgument, "--ranks: ", item,
             " is out of range [2, 1048576]");
    out.push_back(static_cast<int>(r));
  }
  CC_CHECK(!out.empty(), kInvalidArgument, "--ranks: no rank count given");
  return out;
}

std::vector<LinkRate> parse_links(const std::string& s) {
  std::vector<LinkRate> out;
  for (const auto& item : split_list(s)) out.push_back(parse_link_rate(item));
  CC_CHECK(!out.empty(), kInvalidArgument, "--link: no rate given");
  return out;
}

JsonObject to_json(const Projection& p, size_t count) {
  JsonObject j;
  j.add("algo", p.variant.algo)
      .add("pattern", p.variant.pattern)
      .add("hierarchy", p.variant.hierarchy)
      .add("ranks", p.ranks)
      .add("link", p.link.text)
      .add("count", count)
      .add("time_ms", p.time_s() * 1e3)
      .add("compute_ms", p.compute_s * 1e3)
      .add("comm_ms", p.comm_s * 1e3)
      .add("wire_bytes", p.wire_bytes)
      .add("rounds", p.rounds);
  return j;
}

}  // namespace

double contention(const ProjectionInputs& in) {
  std::vector<double> ratios;
  for (const auto& [label, ms] : in.call_ms) {
    const auto alone = in.call_alone_ms.find(label);
    if (alone != in.call_alone_ms.end() && alone->second > 0)
      ratios.push_back(ms / in.call_share / alone->second);
  }
  if (ratios.empty()) return 1.0;
  std::sort(ratios.begin(), ratios.end());
  const size_t m = ratios.size() / 2;
  return ratios.size() % 2 ? ratios[m] : 0.5 * (ratios[m - 1] + ratios[m]);
}

std::vector<Variant> variants_of(const std::vector<std::string>& algos,
                                 const std::vector<std::string>& modes) {
  for (const auto& m : modes) {
    CC_CHECK(m == "off" || m == "host" || m == "shards", kInvalidArgument, "--hierarchy: '", m,
             "' is not one of off, host, shards (auto picks one of them per communicator; "
             "project those instead)");
  }
  std::vector<Variant> out;
  for (const auto& a : algos) {
    find_algorithm(a);  // unknown names fail here
    CC_CHECK(a != "auto", kInvalidArgument,
             "project: auto picks one of the others per call; project those instead");
    if (a == "dgc" || a == "sdagc") {
      out.push_back({a, "allgather"});
      out.push_back({a, "scatter"});
    } else if (a == "sbc") {
      out.push_back({a, "allgather"});  // sbc has no scatter pattern (sparse_allreduce.h)
    } else {
      out.push_back({a, ""});
    }
  }
  CC_CHECK(!out.empty(), kInvalidArgument, "--algo: no algorithm given");
  // Only compressed calls take the hierarchy (plugin/communicator.cc).
  const size_t flat = out.size();
  for (const auto& m : modes) {
    if (m == "off") continue;
    for (size_t i = 0; i < flat; ++i) {
      if (out[i].algo == "dense") continue;
      Variant h = out[i];
      h.hierarchy = m;
      out.push_back(h);
    }
  }
  return out;
}

LinkModel projected_link(const LinkRate& rate, int ranks, const ProjectionInputs& in) {
  LinkModel link;
  link.beta = 8.0 / (double(rate.bits_per_second) * in.goodput);
  link.alpha = in.latency_s + double(ranks - 1) * in.message_s;
  link.alpha_ring = 2.0 * double(ranks - 1) * in.latency_s;
  if (in.measured_latency) {
    link.alpha = in.measured_latency->alpha;
    link.alpha_ring = in.measured_latency->alpha_ring;
  }
  return link;
}

namespace {

// A variant behind the host hierarchy (project.h, "hosts"): the flat
// variant between the hosts, plus the local steps.
Projection project_hierarchical(const Variant& v, int ranks, const LinkRate& rate,
                                const ProjectionInputs& in) {
  const int per_host = in.ranks_per_host;
  const int hosts = ranks / per_host;
  const bool sharded = v.hierarchy == "shards";
  const int slices = sharded ? per_host : 1;
  Variant flat = v;
  flat.hierarchy = "off";
  // The flat variant among the hosts, a port each, with no sharing of
  // cores yet: who computes at once is decided below. With a single host
  // too: the hierarchy still compresses the host sum, with nothing to send.
  ProjectionInputs between = in;
  between.ranks_per_host = 1;
  between.cores = 0;
  Projection p = project_one(flat, hosts, rate, between);
  p.variant = v;
  p.ranks = ranks;
  p.link = rate;
  // The leaders compute, one per host; sharded, every rank does, on 1/N.
  const auto shared = [&](int computing) {
    return in.cores > 0 ? std::max(1.0, double(computing) / double(in.cores)) : 1.0;
  };
  p.compute_s = p.compute_s / double(slices) * shared(sharded ? ranks : hosts);
  // Sharded: each owner sends 1/N of a leader's bytes; the port carries N
  // owners' messages in each round.
  p.wire_bytes /= double(slices);
  p.comm_s += double(p.rounds) * double(slices - 1) * double(std::max(0, hosts - 1)) * in.message_s;
  // memcpy of the tensor: the fastest of the codec runs' timings (each
  // codec run times it once; the minimum is the least disturbed).
  double memcpy_ms = in.speeds.at(v.algo).memcpy_ms;
  for (const auto& [name, speed] : in.speeds) memcpy_ms = std::min(memcpy_ms, speed.memcpy_ms);
  // The leader's copy in, N-1 additions and copy out, one after another;
  // sharded, each rank's copy in, its slice's sum and the gather back, all
  // ranks of the host at once on one memory bus: slowed as C(v) was by
  // W workers at once (f, contention()).
  const double local_ms =
      sharded ? 3.0 * memcpy_ms * contention(in) : double(per_host + 1) * memcpy_ms;
  p.compute_s += local_ms * shared(ranks) * 1e-3;
  return p;
}

}  // namespace

Projection project_one(const Variant& v, int ranks, const LinkRate& rate, const ProjectionInputs& in) {
  const int per_host = in.ranks_per_host;
  if (!v.flat() && per_host > 1) return project_hierarchical(v, ranks, rate, in);
  const size_t n = in.count;
  const LinkModel link = projected_link(rate, ranks, in);
  Projection p;
  p.variant = v;
  p.ranks = ranks;
  p.link = rate;
  CostShape shape;
  if (v.algo == "dense") {
    // One ring latency, as AutoAllreduce::predict_dense.
    shape = {double(ring_allreduce_bytes(n * sizeof(float), ranks)), 1, true};
  } else if (is_sparse(v.algo)) {
    const CodecSpeed& s = in.speeds.at(v.algo);
    const double header = double(kPayloadHeaderBytes + 4);
    const double per_entry =
        s.sent ? std::max(0.0, double(s.payload_bytes) - header) / double(s.sent) : 8.0;
    const SparsePattern pattern =
        v.pattern == "scatter" ? SparsePattern::kScatter : SparsePattern::kAllgather;
    shape = sparse_pattern_cost(pattern, n, ranks, density_for(v.algo, in.params), per_entry);
  } else {
    shape = make_algorithm(v.algo, in.params)->cost_shape(n, ranks);
  }
  if (per_host > 1 && !shape.ring_allreduce) {
    // The host's port carries its N ranks' messages to the other hosts.
    shape.wire_bytes *= double(per_host) * double(ranks - per_host) / double(ranks - 1);
  }
  p.wire_bytes = shape.wire_bytes;
  p.rounds = shape.rounds;
  p.comm_s = predict_seconds(shape, link);
  if (v.algo != "dense") {
    const auto c = in.call_ms.find(v.label());
    CC_CHECK(c != in.call_ms.end(), kInternal, "project: no compute timing for ", v.label());
    const double per_call = c->second / in.call_share;
    // At least a 1/P share of the timed call: onebit's negative extra comes
    // from timings taken apart from C, and on a loaded machine their noise
    // could otherwise price a call at nothing.
    double ms = std::max(per_call / double(ranks),
                         per_call + contention(in) * extra_compute_ms(v, ranks, in));
    if (in.cores > 0) ms *= std::max(1.0, double(ranks) / double(in.cores));
    p.compute_s = ms * 1e-3;
  }
  return p;
}

int cores_here() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

void measure_speeds(const std::vector<Variant>& variants, int iters, ProjectionInputs& in) {
  // A fresh zeroed tensor-sized buffer, as the collectives allocate per
  // call (page faults and zeroing); the median of iters.
  std::vector<double> alloc;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> fresh(in.count, 0.0f);
    const volatile float* keep = fresh.data();  // the allocation is not elided
    (void)keep;
    alloc.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(alloc.begin(), alloc.end());
  in.alloc_ms = alloc[alloc.size() / 2];
  for (const Variant& v : variants) {
    if (v.algo == "dense") continue;
    if (!in.speeds.count(v.algo)) in.speeds[v.algo] = measure_codec(v.algo, in.count, in.params, iters);
  }
  measure_calls(variants, iters, in);
}

void measure_calls(const std::vector<Variant>& variants, int iters, ProjectionInputs& in) {
  std::vector<Variant> alone, together;  // flat variants still to time
  for (const Variant& v : variants) {
    if (v.algo == "dense") continue;
    Variant flat = v;
    flat.hierarchy = "off";
    const auto listed = [&](const std::vector<Variant>& l) {
      return std::any_of(l.begin(), l.end(), [&](const Variant& x) { return x.label() == flat.label(); });
    };
    if (!in.call_alone_ms.count(flat.label()) && !listed(alone)) alone.push_back(flat);
    if (!in.call_ms.count(flat.label()) && !listed(together)) together.push_back(flat);
  }
  for (const auto& [label, ms] : measure_call_compute(alone, in.count, in.params, 1, iters))
    in.call_alone_ms[label] = ms;
  if (in.compute_workers == 1) {
    for (const Variant& v : together) in.call_ms[v.label()] = in.call_alone_ms.at(v.label());
    return;
  }
  for (const auto& [label, ms] :
       measure_call_compute(together, in.count, in.params, in.compute_workers, iters))
    in.call_ms[label] = ms;
}

int project_main(int argc, char** argv, int first) {
  Args args(argc, argv, first);
  const std::string ranks_s =
      args.str("ranks", "4,16,64,256,1024", "rank counts to project, comma-separated");
  const std::string links_s =
      args.str("link", "1gbit,10gbit,100gbit", "link rates (tc syntax), comma-separated");
  const long long count = args.integer("count", 25557032, "float32 elements (K/M/G suffixes)");
  const std::string density = args.str("density", "", "overrides COMPCOLL_DENSITY");
  const std::string algos =
      args.str("algo", "dense,dgc,sbc,sdagc,csc,onebit", "algorithms, comma-separated");
  const double latency_us = args.num("latency-us", 50.0, "one-way latency of a message (us)");
  const double message_us =
      args.num("message-us", 2.0, "sender cost of each further message of a round (us)");
  const double goodput = args.num("goodput", 1448.0 / 1514.0,
                                  "fraction of the link rate carrying payload (TCP over Ethernet)");
  const long long cores = args.integer(
      "cores", 0, "ranks share this many cores (compute x max(1, ranks/cores)); 0: a core each");
  const long long ranks_per_host = args.integer(
      "ranks-per-host", 1,
      "N ranks per host share its port (and its memory, with the hierarchy). Every --ranks must "
      "be a multiple of N");
  const std::string hierarchy_s = args.str(
      "hierarchy", "",
      "with --ranks-per-host > 1: COMPCOLL_HIERARCHY modes to project, comma-separated from off, "
      "host, shards; every compressed variant gets a column per mode (\"dgc/allgather+shards\"). "
      "Default off,host");
  const long long codec_iters = args.integer("codec-iters", 5, "codec timings at start (median)");
  const bool json = args.flag("json", "print a JSON list, one object per (ranks, link, variant)");
  const std::string plot =
      args.str("plot", "", "also draw time per call vs ranks into this PNG (python3, matplotlib)");
  const bool validate = args.flag(
      "validate", "run `allreduce --link` (root) at --validate-ranks on the first --link and print "
                  "projected vs measured time per call and the error (cores: this machine's)");
  const std::string validate_ranks_s =
      args.str("validate-ranks", "4,8,16", "rank counts for --validate");
  const long long validate_iters = args.integer("iters", 5, "--validate: timed calls per run");
  std::string usage;
  if (!args.finish(&usage)) {
    std::cout << "usage: compcoll-bench project [flags]   (COMPCOLL_* variables apply)\n" << usage;
    return 0;
  }
  CC_CHECK(count >= 1, kInvalidArgument, "--count must be >= 1");
  CC_CHECK(latency_us >= 0 && message_us >= 0, kInvalidArgument,
           "--latency-us and --message-us must be >= 0");
  CC_CHECK(goodput > 0 && goodput <= 1, kInvalidArgument, "--goodput must be in (0, 1], not ",
           goodput);
  CC_CHECK(codec_iters >= 1 && validate_iters >= 1, kInvalidArgument,
           "--codec-iters and --iters must be >= 1");
  for (const char* only : {"iters", "validate-ranks"}) {
    if (args.given(only) && !validate) {
      std::cerr << "compcoll-bench project: warning: --" << only
                << " is read by --validate only, so it changes nothing here\n";
    }
  }
  const std::vector<int> ranks = parse_ranks(validate ? validate_ranks_s : ranks_s);
  const std::vector<LinkRate> links = parse_links(links_s);
  CC_CHECK(ranks_per_host >= 1, kInvalidArgument, "--ranks-per-host must be >= 1, not ",
           ranks_per_host);
  for (int r : ranks)
    CC_CHECK(r % ranks_per_host == 0, kInvalidArgument, "--ranks: ", r,
             " is not a multiple of --ranks-per-host ", ranks_per_host);
  CC_CHECK(!(validate && ranks_per_host > 1), kInvalidArgument,
           "--validate runs flat allreduce with a rank per namespace; leave out --ranks-per-host");
  const std::vector<std::string> modes =
      split_list(hierarchy_s.empty() ? (ranks_per_host > 1 ? "off,host" : "off") : hierarchy_s);
  CC_CHECK(ranks_per_host > 1 || std::all_of(modes.begin(), modes.end(),
                                             [](const std::string& m) { return m == "off"; }),
           kInvalidArgument, "--hierarchy ", hierarchy_s,
           ": a hierarchy needs hosts of several ranks; give --ranks-per-host N > 1");
  const std::vector<Variant> variants = variants_of(split_names("algo", algos), modes);

  ProjectionInputs in;
  in.count = static_cast<size_t>(count);
  Config cfg = load_config();
  if (!density.empty()) {
    cfg = load_config([&](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "COMPCOLL_DENSITY") return density;
      return process_env()(name);
    });
  }
  in.params = cfg.params;
  // The steady state: warm-up calls (COMPCOLL_WARMUP_STEPS, 700 by default)
  // send more than density d (dgc, sdagc, sbc) or run dense (onebit), and a
  // projection is of the calls after them. --validate runs the same way.
  in.params.warmup_steps = 0;
  in.latency_s = latency_us * 1e-6;
  in.message_s = message_us * 1e-6;
  in.goodput = goodput;
  in.cores = static_cast<int>(cores);
  in.ranks_per_host = static_cast<int>(ranks_per_host);
  // The cores of this machine: --validate runs every rank here, so they
  // share them; a projection gives each rank a core and its host's N ranks
  // run at once, which is how many workers time C(v) (at most the cores
  // this machine has to time them on).
  const int here = cores_here();
  if (validate && in.cores == 0) in.cores = here;
  // (--validate times C per rank count next to each run, project_validate.cc;
  // here only C1, one process alone.)
  in.compute_workers = validate ? 1 : std::min(here, in.cores > 0 ? in.cores : in.ranks_per_host);
  in.call_share = std::max(1.0, double(in.compute_workers) / double(here));
  std::fprintf(stderr,
               "compcoll-bench project: timing the codecs and each variant's call on %lld "
               "elements (%d at once)...\n",
               count, in.compute_workers);
  // Ctrl-C / SIGTERM: the timing workers and the plotter die, RunDirs go.
  kill_children_on_signals();
  // --validate compares with single runs: 9 timings at least, as there.
  measure_speeds(variants, validate ? std::max(9, int(codec_iters)) : int(codec_iters), in);

  if (validate) {
    return validate_projection(variants, ranks, links[0], in, static_cast<int>(validate_iters),
                               json, density);
  }

  std::vector<Projection> all;
  for (const LinkRate& l : links)
    for (int r : ranks)
      for (const Variant& v : variants) all.push_back(project_one(v, r, l, in));

  std::vector<JsonObject> items;
  for (const Projection& p : all) items.push_back(to_json(p, in.count));
  if (json) {
    std::cout << json_list(items) << std::endl;
  } else {
    const double dgc_density = density_for("dgc", in.params);
    std::printf("# compcoll-bench project: %zu float32, dgc density %g (k = %zu); time per call "
                "(ms) from auto's cost model\n",
                in.count, dgc_density, target_count(dgc_density, in.count));
    std::printf("# codecs timed here on one core each:");
    for (const auto& [name, s] : in.speeds)
      std::printf(" %s %.1f+%.2f ms", name.c_str(), s.encode_ms, s.decode_ms);
    std::printf(" (encode+decode)\n# one call at P = 1, %d at once:", in.compute_workers);
    for (const auto& [label, ms] : in.call_ms) std::printf(" %s %.1f ms", label.c_str(), ms);
    std::printf("\n# link: latency %.0f us, %.1f us per further message, goodput "
                "%.3f; %s; %d rank(s) per host port\n",
                latency_us, message_us, goodput,
                in.cores > 0 ? ("ranks share " + std::to_string(in.cores) + " cores").c_str()
                             : "a core per rank",
                in.ranks_per_host);
    std::printf("#%8s %6s", "link", "ranks");
    // A column as wide as its label (at least 15), so labels never run together.
    const auto width = [](const Variant& v) { return std::max<int>(15, int(v.label().size()) + 1); };
    for (const Variant& v : variants) std::printf(" %*s", width(v), v.label().c_str());
    std::printf("  %s\n", "fastest");
    size_t i = 0;
    for (const LinkRate& l : links) {
      for (int r : ranks) {
        std::printf(" %8s %6d", l.text.c_str(), r);
        const Projection* best = nullptr;
        for (size_t v = 0; v < variants.size(); ++v, ++i) {
          std::printf(" %*.2f", width(variants[v]), all[i].time_s() * 1e3);
          if (!best || all[i].time_s() < best->time_s()) best = &all[i];
        }
        std::printf("  %s\n", best->variant.label().c_str());
      }
    }
  }
  if (!plot.empty()) {
    const RunDir run_dir;
    const std::string& dir = run_dir.path();
    std::ofstream(dir + "/projection.json") << json_list(items) << "\n";
    const std::string title = "compcoll-bench project: " + std::to_string(in.count) +
                              " float32, dgc density " +
                              std::to_string(density_for("dgc", in.params)).substr(0, 6);
    std::vector<Child> plotter{spawn({"/usr/bin/env", "python3",
                                      COMPCOLL_SOURCE_DIR "/scripts/plot_projection.py",
                                      dir + "/projection.json", plot, title},
                                     0, dir + "/plot.log")};
    watch_child(plotter[0].pid);
    ReapOnExit reap(plotter);
    const bool ok = wait_all(plotter, std::chrono::steady_clock::now() + std::chrono::seconds(120),
                             std::chrono::seconds(1));
    if (!ok) {
      std::cerr << "compcoll-bench project: --plot failed: " << tail_of(dir + "/plot.log") << "\n";
      return 1;
    }
    std::cerr << "plot written to " << plot << "\n";
  }
  return 0;
}

}  // namespace compcoll::bench
