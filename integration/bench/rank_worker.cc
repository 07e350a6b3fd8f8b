// The per-rank side of `compcoll-bench allreduce`. Each worker connects to
// the others through the rendezvous, then for each algorithm: agreement on
// the configuration, one untimed warm-up call, K timed calls (each from a
// common start instant on a fresh copy of the gradient; the time of a call
// is the slowest rank's), then correctness figures. Rank 0 writes the
// results.
#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/agreement.h"
#include "collectives/auto.h"
#include "collectives/dense.h"
#include "collectives/hierarchical.h"
#include "collectives/lent_comm.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "integration/bench/allreduce_bench.h"
#include "integration/bench/args.h"
#include "integration/bench/gradients.h"
#include "integration/bench/host_counters.h"
#include "integration/bench/json.h"
#include "integration/bench/report.h"
#include "plugin/communicator.h"
#include "plugin/config.h"
#include "transport/gloo_comm.h"
#include "transport/gloo_connect.h"

namespace compcoll::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// All local ranks share one monotonic clock, so instead of timing from the
// (skewed) exit of a barrier, the ranks agree on a start instant a few
// milliseconds ahead and every rank sleeps until it: a call's time is then
// from that common start to this rank's finish, and the slowest rank's time
// is the collective's. The instant is the latest of every rank's "now + 3
// ms" (a MAX allreduce), so it lies after every rank has finished its
// untimed work of the previous call (copies, the running sum). Had one rank
// picked it alone, a rank still busy with that work would start late and
// its lateness would be billed to the call: with more ranks than cores that
// made the same Gloo ring look 0.5-1.3x as fast as itself from row to row.
Clock::time_point common_start(Comm& comm) {
  int64_t start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         (Clock::now() + std::chrono::milliseconds(3)).time_since_epoch())
                         .count();
  comm.allreduce(&start_ns, 1, DType::kInt64, ReduceOp::kMax);
  const Clock::time_point start{std::chrono::nanoseconds(start_ns)};
  std::this_thread::sleep_until(start);
  return start;
}

// This process's CPU time (every thread: the caller's and the transport's),
// in ms. Summed over ranks per call it is what the call cost the machine:
// with more ranks than cores the time of a call is bounded below by that sum
// divided by the cores, whatever the algorithm's critical path.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

// Median over iterations of a per-call figure combined over ranks with op:
// kMax for the slowest rank's time, kSum for the ranks' CPU time.
double median_over_ranks(Comm& comm, std::vector<double> v, ReduceOp op) {
  if (v.empty()) return 0.0;
  comm.allreduce(v.data(), v.size(), DType::kFloat64, op);
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

bool identical_everywhere(Comm& comm, const std::vector<float>& out) {
  const uint64_t h = fnv(out.data(), out.size() * sizeof(float));
  const Gathered all = comm.allgatherv({reinterpret_cast<const uint8_t*>(&h), sizeof h}, sizeof h);
  for (int r = 0; r < all.parts(); ++r) {
    if (all.part(r).size() != sizeof h || std::memcmp(all.part(r).data(), &h, sizeof h)) return false;
  }
  return true;
}

// Gloo's own allreduce, straight on the Gloo context: the baseline. Gloo's
// errors name neither this rank nor the setting behind the limit: they are
// rethrown as compcoll's (a timeout as TimeoutError, which the caller
// names the setting in).
void gloo_allreduce(GlooComm& comm, float* buf, size_t n) {
  if (n == 0) return;
  gloo::AllreduceOptions opts(comm.gloo_context());
  opts.setOutput(buf, n);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  opts.setTag(comm.reserve_tag());
  opts.setTimeout(comm.timeout());
  try {
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    const std::string what = detail::concat(
        "rank ", comm.rank(), "/", comm.size(), ": Gloo's own allreduce of ", n,
        " floats (the dense baseline) failed: ", e.what());
    // Gloo says a timeout only in its message (as in transport/call_scope.cc).
    if (std::string_view(e.what()).find("Timed out") != std::string_view::npos) {
      throw TimeoutError(what + " (no progress within the " +
                             std::to_string(comm.timeout().count()) +
                             " ms timeout: a rank may be dead, hung or slow)",
                         comm.timeout());
    }
    CC_THROW(kTransport, what);
  }
}

// The worker's calls outside a Communicator (Gloo's baseline, the fences,
// the reductions of the results, an algorithm run on the bare GlooComm)
// time out with the transport's message; like a Communicator's, theirs
// then names the setting behind the limit.
template <typename Call>
auto naming_the_timeout(const Config& cfg, Call&& call) {
  try {
    return call();
  } catch (const TimeoutError& e) {
    throw naming_timeout_setting(
        e, cfg, "a dead or stuck rank fails any limit; a slow --link or a large --count only a "
                "short one");
  }
}

}  // namespace

int worker_main(int argc, char** argv, int first) {
  // A rank dies with the benchmark that started it: a parent killed by
  // SIGKILL runs no handler, and its ranks would run on to their deadline.
  // (The parent spawns ranks from its main thread, whose exit is the
  // process's.) A parent already gone before the prctl: stop at once.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent == 1 || getppid() != parent) return 1;
  Args args(argc, argv, first);
  const int rank = static_cast<int>(args.integer("rank", 0, "this rank"));
  const int ranks = static_cast<int>(args.integer("ranks", 1, "number of ranks"));
  const std::string spec = args.str("rendezvous", "", "file://DIR or redis://HOST:PORT");
  const std::string algos = args.str("algo", "dense", "algorithms, comma-separated");
  const size_t n = static_cast<size_t>(args.integer("count", 1 << 20, "float32 elements"));
  const std::string sizes = args.str("sizes", "", "message sizes in bytes to sweep, e.g. 4K,64K,1M");
  const int iters = static_cast<int>(args.integer("iters", 5, "timed calls per algorithm"));
  const int warmup = static_cast<int>(args.integer("warmup", 1, "untimed calls per algorithm first"));
  const std::string density = args.str("density", "", "overrides COMPCOLL_DENSITY");
  const std::string out_path = args.str("out", "", "rank 0 writes results here");
  const std::string gradient = args.str("gradient", "gaussian", "input");
  const GradientKind kind = parse_gradient_kind(gradient);
  const auto seed = static_cast<uint64_t>(args.integer("seed", 1, "random seed"));
  const bool skip_baseline = args.flag("skip-dense-baseline", "do not time Gloo's own allreduce");
  const bool probe_link =
      args.flag("probe-link", "measure the cost model's link terms first, as auto does");
  const bool progress =
      args.flag("progress", "rank 0 writes its progress beside --out (the parent's terminal)");
  const std::string tx_iface =
      args.str("tx-iface", "", "meter this interface's tx bytes per timed call (host_tx_bytes)");
  const int ranks_per_host = static_cast<int>(
      args.integer("ranks-per-host", 1, "ranks [h*N, (h+1)*N) share host h (one meter reads)"));
  const std::string hierarchy_modes =
      args.str("hierarchy", "", "hierarchy modes, comma-separated (default: COMPCOLL_HIERARCHY)");
  std::string usage;
  if (!args.finish(&usage)) {
    std::cout << usage;
    return 0;
  }
  // COMPCOLL_* settings (a bad value fails here, before traffic), without
  // those the benchmark's flags give (the parent says they change nothing).
  const EnvLookup env = env_read_by(FrontEnd::kBenchmark);
  Config cfg = load_config(env);
  if (!density.empty()) {
    cfg = load_config([&](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "COMPCOLL_DENSITY") return density;
      return env(name);
    });
  }
  cfg.front_end = FrontEnd::kBenchmark;
  const std::vector<std::string> names = split_list(algos);
  for (const auto& a : names) find_algorithm(a);  // unknown names fail before traffic

  GlooOptions opts;
  opts.rank = rank;
  opts.size = ranks;
  opts.rendezvous = spec;
  opts.transport = cfg.transport;
  opts.iface = cfg.iface;
  opts.hostname = cfg.hostname;
  opts.timeout = cfg.timeout;
  opts.prefix = "bench";
  CC_CHECK(ranks_per_host >= 1 && ranks % ranks_per_host == 0, kInvalidArgument,
           "--ranks-per-host ", ranks_per_host, " does not divide --ranks ", ranks);
  // One reader per host: the host's first rank. Opened before connecting, so
  // a missing interface fails before any traffic.
  std::unique_ptr<HostTxMeter> meter;
  if (!tx_iface.empty()) meter = std::make_unique<HostTxMeter>(tx_iface, rank % ranks_per_host == 0);
  std::unique_ptr<GlooComm> comm;
  try {
    comm = connect_gloo(opts);
  } catch (const TimeoutError& e) {
    throw naming_timeout_setting(e, cfg, "raise it for ranks that start slowly");
  }
  // Ranks started with different shapes of run (two benchmarks sharing one
  // rendezvous, a hand-started rank) would make different calls: Gloo then
  // aborts or waits out its timeout. Compared once, named on every rank.
  ensure_agreement(*comm, "bench:algo=" + algos + ";count=" + std::to_string(n) + ";sizes=" +
                              sizes + ";iters=" + std::to_string(iters) + ";warmup=" +
                              std::to_string(warmup) + ";gradient=" + gradient +
                              ";seed=" + std::to_string(seed) + ";ranks-per-host=" +
                              std::to_string(ranks_per_host) + ";hierarchy=" +
                              (hierarchy_modes.empty() ? cfg.hierarchy : hierarchy_modes) +
                              ";skip-dense-baseline=" + (skip_baseline ? "1" : "0") +
                              ";probe-link=" + (probe_link ? "1" : "0") +
                              ";tx-iface=" + (tx_iface.empty() ? "0" : "1"),
                   {"the benchmark's run", "start every rank with the same flags"});
  // The link as auto's cost model sees it (collectives/auto.h), measured
  // before any algorithm runs: `project --validate` projects with it.
  std::optional<LinkModel> link_model;
  if (probe_link) link_model = measure_link(*comm);
  int hosts = 0;  // distinct host identities, as the hierarchy would find them
  if (meter) {
    const std::string id = default_host_identity();
    const Gathered ids = comm->allgatherv({reinterpret_cast<const uint8_t*>(id.data()), id.size()}, 4096);
    std::vector<std::string> seen;
    for (int r = 0; r < ids.parts(); ++r) {
      std::string s(reinterpret_cast<const char*>(ids.part(r).data()), ids.part(r).size());
      if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
    }
    hosts = static_cast<int>(seen.size());
  }

  // Sizes to sweep (elements); --sizes wins over --count.
  std::vector<size_t> counts;
  for (const auto& s : split_list(sizes)) counts.push_back(parse_size_in_floats("--sizes", s));
  if (counts.empty()) counts.push_back(n);
  const size_t max_n = *std::max_element(counts.begin(), counts.end());
  const std::vector<float> grad = make_gradient(kind, max_n, seed + 7919 * rank);

  // The rows: one per algorithm and hierarchy mode (--hierarchy LIST, else
  // COMPCOLL_HIERARCHY), one algorithm object each for the whole sweep (auto
  // measures the link once, as a communicator would). Compressed algorithms
  // in a hierarchical mode run behind the host hierarchy, decided as a
  // Communicator decides it; every other row runs flat.
  std::vector<std::string> modes = split_list(hierarchy_modes);
  if (modes.empty()) modes.push_back(cfg.hierarchy);
  std::unique_ptr<Hierarchy> hierarchy;
  const auto compressed = std::find_if(names.begin(), names.end(),
                                       [](const std::string& a) { return a != "dense"; });
  const auto hierarchical = std::find_if(modes.begin(), modes.end(),
                                         [](const std::string& m) { return m != "off"; });
  if (compressed != names.end() && hierarchical != modes.end()) {  // the parent allows one such mode
    Config hcfg = cfg;
    hcfg.algo = *compressed;
    hcfg.hierarchy = *hierarchical;
    HierarchyChoice choice = choose_hierarchy(*comm, hcfg);
    hierarchy = std::move(choice.hierarchy);
    // The parent passes warnings on; the rest only under COMPCOLL_DEBUG=INFO.
    if (rank == 0 && !choice.why.empty()) {
      std::fprintf(stderr, "compcoll-bench: %s%s\n", choice.warn ? "warning: " : "",
                   choice.why.c_str());
    }
  }
  struct Row {
    std::string algo;
    std::string hierarchy;  // "host" or "shards" when the row runs behind the hierarchy, else "off"
    std::unique_ptr<Algorithm> algorithm;       // compressed rows
    std::unique_ptr<Communicator> communicator;  // the dense row: the path a user's call takes
  };
  std::vector<Row> rows;
  for (const std::string& mode : modes) {
    const bool behind = hierarchy && mode != "off";
    for (const std::string& name : names) {
      if (name == "dense" && &mode != &modes.front()) continue;  // one dense row
      // Named by the hierarchy that runs ("host" for auto too; "shards"
      // only when the slices did not fall back to one leader per host).
      const std::string behind_as = hierarchy && hierarchy->slices() > 1 ? "shards" : "host";
      Row row{name, behind && name != "dense" ? behind_as : "off", nullptr, nullptr};
      if (name == "dense") {
        // Through a real Communicator (policy, state keys, stats, logging)
        // over a view of the same transport: compcoll's dense row is then
        // what every call a user does not compress pays, against Gloo's own
        // allreduce on the same sockets.
        Config dcfg = cfg;
        dcfg.algo = "dense";
        dcfg.hierarchy = "off";
        dcfg.stats_file.clear();
        // The ranks run every algorithm from one environment: a variable
        // that tunes another algorithm is not inert for the run.
        dcfg.report_inert_settings = false;
        row.communicator = std::make_unique<Communicator>(std::make_unique<LentComm>(*comm), dcfg);
      } else {
        ensure_agreement(*comm, "algo=" + name + ";hierarchy=" + row.hierarchy + ";" +
                                    cfg.params.canonical());
        row.algorithm = make_algorithm(name, cfg.params);
        if (row.hierarchy != "off") {
          row.algorithm = std::make_unique<HierarchicalAlgorithm>(std::move(row.algorithm), *hierarchy);
        }
        row.algorithm->attach(*comm);
      }
      rows.push_back(std::move(row));
    }
  }

  std::vector<AllreduceResult> results;
  std::vector<float> buf(max_n);
  // Rank 0's progress for the parent's terminal (allreduce_bench.cc; only
  // with --progress, which the parent gives when stderr is one): one line,
  // replaced whole (written aside, then renamed) after every round of
  // turns, so that a run of a minute is not a minute of silence.
  const auto say_progress = [&](size_t size_index, int done_rounds) {
    if (!progress || rank != 0 || out_path.empty()) return;
    const std::string tmp = out_path + ".progress.tmp";
    std::ofstream(tmp) << counts[size_index] << " elements"
                       << (counts.size() > 1 ? " (size " + std::to_string(size_index + 1) + " of " +
                                                   std::to_string(counts.size()) + ")"
                                             : std::string())
                       << ": round " << done_rounds << " of " << warmup + iters
                       << " (one call of every row" << (skip_baseline ? "" : " and of Gloo's")
                       << "; the first " << warmup << " untimed)";
    std::rename(tmp.c_str(), (out_path + ".progress").c_str());
  };
  // Every call below, however deep, names the setting behind a timeout.
  naming_the_timeout(cfg, [&] {
    for (size_t size_index = 0; size_index < counts.size(); ++size_index) {
      const size_t count = counts[size_index];
      std::vector<double> exact(grad.begin(), grad.begin() + count);
      if (count) comm->allreduce(exact.data(), count, DType::kFloat64, ReduceOp::kSum);
      double exact_norm = 0.0;
      for (double x : exact) exact_norm += x * x;
      exact_norm = std::sqrt(exact_norm);

      // The rows and Gloo's own allreduce (the baseline, last turn index) take
      // turns within each iteration, and the turn order rotates from one
      // iteration to the next: a slow moment of the machine, or the
      // after-effects of the previous call on the link (a dense call leaves
      // the link and caches in another state than a sparse one), costs all of
      // them alike, the baseline included.
      struct Run {
        std::unique_ptr<CodecState> state;
        std::vector<double> running;
        std::vector<double> times;
        std::vector<double> cpu;  // this rank's CPU time per timed call
        uint64_t wire = 0;
        uint64_t host_tx = 0;  // this host's interface over the timed calls (reader only)
        std::vector<float> out;
      };
      std::vector<Run> runs(rows.size());
      for (size_t a = 0; a < rows.size(); ++a) {
        if (rows[a].algorithm) runs[a].state = rows[a].algorithm->make_state(count, ranks);
        runs[a].running.assign(count, 0.0);
      }
      std::vector<double> dense_times, dense_cpu;
      std::vector<double> baseline_running(skip_baseline ? 0 : count, 0.0);
      const size_t turns = rows.size() + (skip_baseline ? 0 : 1);
      std::fprintf(stderr, "compcoll-bench worker rank %d: running %s at %zu elements\n", rank,
                   algos.c_str(), count);
      for (int it = -warmup; it < iters; ++it) {
        for (size_t turn = 0; turn < turns; ++turn) {
          const size_t a = (turn + static_cast<size_t>(it + warmup)) % turns;
          std::copy(grad.begin(), grad.begin() + count, buf.begin());
          if (a == rows.size()) {  // the baseline
            const auto t0 = common_start(*comm);
            const double cpu0 = process_cpu_ms();
            gloo_allreduce(*comm, buf.data(), count);
            if (it >= 0) {
              dense_times.push_back(ms_since(t0));
              dense_cpu.push_back(process_cpu_ms() - cpu0);
            }
            // The same untimed work as a row's turn (its running sum below):
            // without it, the turn after the baseline found caches and ranks
            // in another state than the turn after a row, and compcoll's own
            // dense row, the same Gloo ring, measured ~10 % slower than Gloo.
            for (size_t i = 0; i < count; ++i) baseline_running[i] += buf[i];
            continue;
          }
          Run& run = runs[a];
          // Metered calls are fenced by barriers (host_counters.h): whatever
          // ran before (warm-up, the Gloo baseline, another algorithm) is off
          // the wire when the counter is read, and all of this call is on it
          // at the second read. The fences are outside the timed interval.
          const bool metered = meter && it >= 0;
          if (metered) {
            comm->barrier();
            meter->begin();
          }
          const auto t0 = common_start(*comm);
          const double cpu0 = process_cpu_ms();
          const uint64_t before = comm->bytes_sent();
          if (rows[a].communicator) {
            rows[a].communicator->allreduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);
          } else {
            rows[a].algorithm->allreduce(*comm, buf.data(), count, /*average=*/false, *run.state);
          }
          const double ms = ms_since(t0);
          const double cpu = process_cpu_ms() - cpu0;
          const uint64_t sent = comm->bytes_sent() - before;  // the fence below is not the call's
          if (metered) {
            comm->barrier();
            run.host_tx += meter->end();
          }
          if (it >= 0) {
            run.times.push_back(ms);
            run.cpu.push_back(cpu);
            run.wire += sent;
          }
          for (size_t i = 0; i < count; ++i) run.running[i] += buf[i];
          if (it == iters - 1) run.out.assign(buf.begin(), buf.begin() + count);
        }
        say_progress(size_index, it + warmup + 1);
      }
      const double dense_ms = median_over_ranks(*comm, dense_times, ReduceOp::kMax);
      const double dense_cpu_ms = median_over_ranks(*comm, dense_cpu, ReduceOp::kSum);
      for (size_t a = 0; a < rows.size(); ++a) {
        Run& run = runs[a];
        AllreduceResult r;
        r.algo = rows[a].algo;
        r.hierarchy = rows[a].hierarchy;
        r.ranks = ranks;
        r.count = count;
        r.iters = iters;
        r.time_ms = median_over_ranks(*comm, run.times, ReduceOp::kMax);
        r.dense_time_ms = dense_ms;
        r.cpu_ms = median_over_ranks(*comm, run.cpu, ReduceOp::kSum);
        r.dense_cpu_ms = dense_cpu_ms;
        r.wire_bytes = iters > 0 ? run.wire / iters : 0;
        // What Gloo's ring sends from this rank, as the dense row's wire_bytes
        // (a ring's share differs by rank at a few elements).
        r.dense_wire_bytes = gloo_ring_bytes_sent(rank, ranks, count * sizeof(float), sizeof(float));
        r.decision = rows[a].algorithm ? rows[a].algorithm->last_decision() : "";
        double err = 0.0, run_err = 0.0;
        const double calls = iters + warmup;
        for (size_t i = 0; i < count; ++i) {
          err += (run.out[i] - exact[i]) * (run.out[i] - exact[i]);
          run_err += (run.running[i] - calls * exact[i]) * (run.running[i] - calls * exact[i]);
        }
        r.rel_error = exact_norm > 0 ? std::sqrt(err) / exact_norm : std::sqrt(err);
        r.running_rel_error = exact_norm > 0 ? std::sqrt(run_err) / (calls * exact_norm) : 0.0;
        r.identical = identical_everywhere(*comm, run.out);
        if (link_model) {
          r.link_alpha_ms = link_model->alpha * 1e3;
          r.link_alpha_ring_ms = link_model->alpha_ring * 1e3;
          r.link_beta_ns = link_model->beta * 1e9;
        }
        if (meter) {
          // The busiest host: non-readers contribute 0 to the MAX.
          int64_t tx = static_cast<int64_t>(run.host_tx);
          comm->allreduce(&tx, 1, DType::kInt64, ReduceOp::kMax);
          r.has_host_tx = true;
          r.host_tx_bytes = iters > 0 ? static_cast<uint64_t>(tx) / static_cast<uint64_t>(iters) : 0;
          r.ranks_per_host = ranks_per_host;
          r.hosts = hosts;
        }
        results.push_back(r);
      }
      std::fprintf(stderr, "compcoll-bench worker rank %d: %s done\n", rank, algos.c_str());
    }
  });
  if (rank == 0 && !out_path.empty()) {
    std::ofstream(out_path) << results_json(results) << "\n";
    std::ofstream(out_path + ".txt") << results_table(results);
  }
  return 0;
}

}  // namespace compcoll::bench
