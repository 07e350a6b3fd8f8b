// The parent side of `compcoll-bench allreduce`: spawns R worker processes
// (this same binary, subcommand `worker`) that meet through a FileStore in a
// fresh temporary directory (or the --rendezvous given), waits for them, and
// prints rank 0's results. Any rank failing makes the whole run fail (exit
// 1) with that rank's status and the end of its log; nothing is left running.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/auto.h"
#include "collectives/registry.h"
#include "collectives/sparse_allreduce.h"
#include "compcoll/error.h"
#include "integration/bench/allreduce_bench.h"
#include "integration/bench/args.h"
#include "integration/bench/gradients.h"
#include "integration/bench/netns.h"
#include "integration/bench/process.h"
#include "plugin/config.h"
#include "transport/rendezvous.h"

namespace compcoll::bench {
namespace {

// Flags and settings that would change nothing, or less than they seem, in
// this run: said on stderr before it starts, since what the ranks' own
// communicators say goes to their logs, which are shown only when a rank
// fails.
void warn_about_what_changes_nothing(const std::vector<std::string>& algos, const Config& cfg,
                                     const std::string& density, const std::string& sizes,
                                     long long count, bool count_given, bool hierarchical,
                                     int hosts, long long ranks_per_host) {
  const auto warn = [](const std::string& what) {
    std::cerr << "compcoll-bench allreduce: warning: " << what << "\n";
  };
  bool reads_density = false;
  std::string ignores_density;
  for (const std::string& a : algos) {
    if (a == "dgc" || a == "sdagc" || a == "sbc" || a == "auto") {
      reads_density = true;
    } else if (a == "csc" || a == "onebit") {
      ignores_density += (ignores_density.empty() ? "" : ", ") + a;
    }
  }
  if (!density.empty() && !reads_density && ignores_density.empty()) {
    warn("--density sets COMPCOLL_DENSITY (dgc, sdagc, sbc), and no row of this run reads it");
  }
  if (!density.empty() && !ignores_density.empty()) {
    warn(detail::concat("--density sets COMPCOLL_DENSITY (dgc, sdagc, sbc) and changes nothing for ",
                        ignores_density, reads_density ? "" : ", so nothing in this run",
                        " (csc's chunk fraction is COMPCOLL_CSC_FRACTION; onebit sends every sign)"));
  }
  if (!sizes.empty() && count_given) warn("--sizes is swept, so --count changes nothing");
  std::vector<long long> counts;
  if (sizes.empty()) {
    counts.push_back(count);
  } else {
    for (const auto& s : split_list(sizes)) counts.push_back(static_cast<long long>(parse_size_in_floats("--sizes", s)));
  }
  std::string small;
  for (const long long c : counts) {
    if (c > 0 && static_cast<size_t>(c) < cfg.min_elems) small += (small.empty() ? "" : ", ") + std::to_string(c);
  }
  if (!small.empty() && algos != std::vector<std::string>{"dense"}) {
    warn(detail::concat(small, " elements: below COMPCOLL_MIN_ELEMS=", cfg.min_elems,
                        ", so a call of that size goes exact in a user's job (the dense row); the "
                        "compressed rows time their algorithm on it anyway"));
  }
  if (hierarchical && hosts == 1) {
    warn("--hierarchy: every rank is on one host (no --link, or --ranks-per-host equal to "
         "--ranks), so a hierarchical row's one leader compresses for no peer: its time and "
         "bytes are not what the hierarchy does between hosts (run it with --link and "
         "--ranks-per-host)");
  } else if (hierarchical && ranks_per_host == 1) {
    warn("--hierarchy: every host has one rank (--ranks-per-host 1), so there is nothing to "
         "reduce within a host and the hierarchy changes nothing: its rows run the flat "
         "algorithm (JSON \"hierarchy\": \"off\"); give --ranks-per-host 2 or more");
  }
}

// The ranks' own compcoll lines (a setting that changes nothing, say): a run
// that succeeds removes their logs with its directory, unread. WARN and
// above from every rank, each text once; with COMPCOLL_DEBUG=INFO or TRACE,
// rank 0's every line as well. `said`: texts already said.
void pass_on_rank_logs(const std::vector<Child>& children, LogLevel level,
                       std::set<std::string> said) {
  for (const Child& c : children) {
    std::istringstream in(read_file(c.log));
    for (std::string line; std::getline(in, line);) {
      // The library's lines, and a rank's own notes ("compcoll-bench: ...",
      // rank 0 only: the hierarchy's choice, say).
      const bool note = line.rfind("compcoll-bench: ", 0) == 0;
      if (line.rfind("compcoll ", 0) != 0 && !note) continue;
      const bool warning = line.rfind("compcoll-bench: warning: ", 0) == 0 ||
                           line.rfind("compcoll WARN", 0) == 0 || line.rfind("compcoll ERROR", 0) == 0;
      if (!warning && !(c.rank == 0 && level >= LogLevel::kInfo)) continue;
      // "compcoll WARN [rank 3] text": the same text from every rank once.
      const size_t text = line.find("] ");
      if (warning && !said.insert(text == std::string::npos ? line : line.substr(text + 2)).second) {
        continue;
      }
      std::cerr << line << "\n";
    }
  }
}

// What one rank holds per element of the largest size, measured 2026-12-04
// (the largest resident set of a rank, /usr/bin/time, 2 ranks, 16M floats):
// 36 bytes for what every row shares (the gradient, the call's buffer, the
// exact sum, Gloo's own), and about 16 more for each compressed algorithm's
// state and payloads (dense 598 MB, dense and dgc 666 MB, dense, dgc and
// sbc 928 MB, all six 1.95 GB).
constexpr double kSharedBytesPerElement = 36.0;
constexpr double kBytesPerElementPerAlgorithm = 16.0;

// /proc/meminfo's MemAvailable in bytes, or 0 where it cannot be read.
double memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0.0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return 0.0;
}

// A run whose ranks cannot fit in memory fails before any rank starts (it
// sat silent for minutes, then the kernel's OOM killer took a rank): one
// that needs more than twice what is available, so that an estimate off by
// as much never refuses a run that fits; one that may not fit is warned
// about.
void check_memory(const std::vector<std::string>& algos, long long largest, int ranks) {
  const double available = memory_available();
  if (available <= 0.0 || largest <= 0) return;
  double per_element = kSharedBytesPerElement;
  for (const std::string& a : algos) per_element += a == "dense" ? 0.0 : kBytesPerElementPerAlgorithm;
  const double need = static_cast<double>(ranks) * static_cast<double>(largest) * per_element;
  const auto gib = [](double b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(s);
  };
  const std::string what = detail::concat(
      "this run needs about ", gib(need), " of memory (", ranks, " ranks x ", largest,
      " elements x about ", static_cast<int>(per_element),
      " bytes: the buffers every row shares and each compressed algorithm's state) and the "
      "machine has ", gib(available), " available (/proc/meminfo)");
  CC_CHECK(need <= 2.0 * available, kInvalidArgument, what,
           ": use fewer --ranks, a smaller --count or --sizes, or fewer --algo");
  if (need > 0.7 * available) {
    std::cerr << "compcoll-bench allreduce: warning: " << what
              << ": it may not fit, and the kernel would stop a rank that does not\n";
  }
}

long long largest_count(const std::string& sizes, long long count) {
  if (sizes.empty()) return count;
  long long largest = 0;
  for (const auto& s : split_list(sizes)) {
    largest = std::max(largest, static_cast<long long>(parse_size_in_floats("--sizes", s)));
  }
  return largest;
}

// The ranks' progress on one line of a terminal's stderr, replaced as rank 0
// rewrites its progress file (rank_worker.cc), and erased before the table
// is printed. Nothing at all when stderr is not a terminal: logs and
// scripts see only the table and the warnings.
class TerminalProgress {
 public:
  explicit TerminalProgress(std::string path) : path_(std::move(path)), on_(isatty(STDERR_FILENO) == 1) {
    show("starting the ranks");
  }
  void poll() {
    if (!on_) return;
    const std::string line = read_file(path_);
    if (!line.empty() && line != last_) show(line);
  }
  void clear() {
    if (on_ && !last_.empty()) std::cerr << "\r\033[K" << std::flush;
    last_.clear();
  }

 private:
  void show(const std::string& line) {
    if (!on_) return;
    last_ = line;
    std::cerr << "\r\033[Kcompcoll-bench allreduce: " << line << std::flush;
  }
  std::string path_;
  bool on_;
  std::string last_;
};

// The machine's 1-minute load average (/proc/loadavg), or a negative value
// where it cannot be read.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1.0;
  if (!(in >> load)) return -1.0;
  return load;
}

// The table's times are wall times on a machine others may use: the load
// when the run started, and a warning where it exceeds the cores (every
// time of the table then carries the other work).
std::string machine_load_line(double load) {
  if (load < 0.0) return {};
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  char line[200];
  std::snprintf(line, sizeof line, "# machine: load average %.2f on %u cores when the run started%s\n",
                load, cores,
                load > cores ? " (more than the cores: other work is in these times; rerun on an "
                               "idle machine)"
                             : "");
  return line;
}

// --plot's python3 and matplotlib, checked before any rank starts: the
// default run takes a minute, which a plot failing after it would waste.
bool plotter_ready(const std::string& dir) {
  const std::string log = dir + "/plot-check.log";
  std::vector<Child> check{spawn({"/usr/bin/env", "python3", "-c", "import matplotlib"}, 0, log)};
  watch_child(check.back().pid);
  const ReapOnExit reap(check);
  if (wait_all(check, std::chrono::steady_clock::now() + std::chrono::seconds(60),
               std::chrono::seconds(1))) {
    return true;
  }
  std::cerr << "compcoll-bench allreduce: --plot needs python3 with matplotlib, and the python3 "
               "on PATH has none (activate the project's venv, source .venv/bin/activate, or "
               "pip install matplotlib); nothing was run: "
            << tail_of(log, 300) << "\n";
  return false;
}

}  // namespace

int allreduce_main(int argc, char** argv, int first) {
  Args args(argc, argv, first);
  const long long ranks_arg = args.integer(
      "ranks", 4,
      "local ranks (processes), 1 to 1024. With 1 rank, as in nccl-tests, nothing crosses a wire: "
      "busbw and wire(B) are 0 and ratio is n/a (JSON null); time is the algorithm's local cost. "
      "--count 0 likewise times an empty call (ratio n/a)");
  const std::string algos =
      args.str("algo", "dense,dgc,sbc,sdagc,csc,onebit", "algorithms, comma-separated");
  const long long count = args.integer("count", 25557032, "float32 elements (K/M/G suffixes)");
  const long long iters = args.integer("iters", 5, "timed calls per algorithm (median reported)");
  const long long warmup_arg = args.integer(
      "warmup", 1,
      "untimed calls per algorithm before timing (with auto in --algo the default is 7, the "
      "calls auto needs to finish its trials). Not "
      "COMPCOLL_WARMUP_STEPS: unless that is set, the ranks run with it at 0, so the table is the "
      "steady state (its first line says which)");
  const std::string density = args.str("density", "", "overrides COMPCOLL_DENSITY");
  const std::string sizes =
      args.str("sizes", "", "message sizes in bytes to sweep instead of --count, e.g. 4K,1M,128M");
  const std::string rendezvous =
      args.str("rendezvous", "", "file://DIR or redis://HOST:PORT (default: a fresh temp dir)");
  const std::string gradient = args.str("gradient", "gaussian", "input: gaussian, t3, mixed");
  const long long seed = args.integer("seed", 1, "random seed");
  const long long deadline_s = args.integer("deadline", 1800, "seconds before every rank is killed");
  const std::string link = args.str(
      "link", "", "run each rank in its own network namespace on a bridge, links shaped to RATE "
                  "(e.g. 1gbit, 10gbit; needs root); see docs/networks.md");
  const long long ranks_per_host = args.integer(
      "ranks-per-host", 1,
      "with --link: N ranks share each network namespace (a \"host\"; --ranks must be a multiple "
      "of N). With --link every row gains host_tx_bytes: the most bytes any namespace's interface "
      "sent per timed call, from the kernel's counters (incl. TCP/IP headers, ACKs and a few "
      "hundred bytes of the benchmark's own fences). Without --link all ranks share the machine's "
      "loopback with everything else, so no host_tx_bytes is reported");
  const std::string hierarchy = args.str(
      "hierarchy", "",
      "host hierarchy modes to compare in this run, comma-separated from off, host, shards, auto (at most "
      "one other than off), e.g. off,host: every compressed algorithm then gets a row per mode "
      "(\"dgc+host\" behind the hierarchy; JSON \"hierarchy\"). Default: COMPCOLL_HIERARCHY");
  const bool probe_link = args.flag(
      "probe-link", "first measure the link as auto's cost model does (alpha, alpha_ring, beta); "
                    "rows gain link_alpha_ms, link_alpha_ring_ms, link_beta_ns (project --validate)");
  const bool json = args.flag("json", "print the JSON list of the CLI contract");
  const std::string plot = args.str("plot", "", "also draw time vs size per algorithm into this PNG "
                                                "(python3 with matplotlib)");
  std::string usage;
  if (!args.finish(&usage)) {
    std::cout << "usage: compcoll-bench allreduce [flags]   (COMPCOLL_* variables apply)\n" << usage;
    return 0;
  }
  // 1024: what the signal handlers can track (process.cc), and far more
  // processes than one machine runs usefully.
  CC_CHECK(ranks_arg >= 1 && ranks_arg <= 1024, kInvalidArgument,
           "--ranks must be in [1, 1024], not ", ranks_arg);
  const int ranks = static_cast<int>(ranks_arg);
  // Bounded as codec's: the ranks count them in an int, and a run that
  // long is a typo, not a measurement.
  CC_CHECK(iters >= 1 && iters <= 1000000, kInvalidArgument, "--iters must be in [1, 1000000], not ",
           iters);
  CC_CHECK(warmup_arg >= 0 && warmup_arg <= 1000000, kInvalidArgument,
           "--warmup must be in [0, 1000000], not ", warmup_arg);
  // auto times dense against compressed in its first calls of a size: timed,
  // those would be reported as its steady state.
  const auto algo_list = split_names("algo", algos);
  const bool has_auto = std::find(algo_list.begin(), algo_list.end(), "auto") != algo_list.end();
  const long long warmup = has_auto && !args.given("warmup")
                               ? std::max<long long>(warmup_arg, kCallsUntilSettled)
                               : warmup_arg;
  if (has_auto && args.given("warmup") && warmup < static_cast<long long>(kCallsUntilSettled)) {
    std::cerr << "compcoll-bench allreduce: warning: --warmup " << warmup << ": auto settles its "
              << "choice after " << kCallsUntilSettled << " calls of a size, so its row times "
              << "its trials (dense and compressed in turn), not its steady state\n";
  }
  // 0 would kill every rank at once, as if it had hung.
  CC_CHECK(deadline_s >= 1 && deadline_s <= 7 * 24 * 3600, kInvalidArgument,
           "--deadline must be in [1, 604800] seconds, not ", deadline_s);
  // Bad values here, not in every rank's log.
  try {
    parse_gradient_kind(gradient);
  } catch (const Error& e) {
    CC_THROW(kInvalidArgument, "--gradient: ", message_without_prefix(e));
  }
  if (!rendezvous.empty()) {
    try {
      parse_store_spec(rendezvous);
    } catch (const Error& e) {
      CC_THROW(kInvalidArgument, "--rendezvous: ", message_without_prefix(e));
    }
  }
  CC_CHECK(ranks_per_host >= 1, kInvalidArgument, "--ranks-per-host must be >= 1, not ",
           ranks_per_host);
  CC_CHECK(ranks % ranks_per_host == 0, kInvalidArgument, "--ranks ", ranks,
           " is not a multiple of --ranks-per-host ", ranks_per_host,
           " (every host gets the same number of ranks)");
  CC_CHECK(ranks_per_host == 1 || !link.empty(), kInvalidArgument,
           "--ranks-per-host needs --link (hosts are network namespaces)");
  const int hosts = ranks / static_cast<int>(ranks_per_host);
  int hierarchical_modes = 0;
  bool forced_hierarchy = false;  // host or shards: a hierarchy even where auto stays flat
  for (const auto& m : split_list(hierarchy)) {
    CC_CHECK(m == "off" || m == "host" || m == "shards" || m == "auto", kInvalidArgument,
             "--hierarchy: '", m, "' is not one of off, host, shards, auto");
    hierarchical_modes += m != "off";
    forced_hierarchy = forced_hierarchy || m == "host" || m == "shards";
  }
  CC_CHECK(hierarchical_modes <= 1, kInvalidArgument,
           "--hierarchy: at most one mode other than off (one hierarchy per run), got '", hierarchy,
           "'");
  for (const auto& a : split_names("algo", algos)) find_algorithm(a);  // reject unknown names up front
  Config cfg = load_config(env_read_by(FrontEnd::kBenchmark));  // and bad COMPCOLL_* values
  cfg.front_end = FrontEnd::kBenchmark;
  for (const auto& a : split_names("algo", algos)) {           // and settings refused together
    CC_CHECK(!(a == "sbc" && cfg.params.sparse_pattern == SparsePattern::kScatter), kInvalidArgument,
             "--algo sbc: ", kSbcRefusesScatter);
  }
  if (!density.empty()) {  // and a bad --density, here once rather than in every rank's log
    try {
      load_config([&](const char* name) -> std::optional<std::string> {
        if (std::string(name) == "COMPCOLL_DENSITY") return density;
        return env_read_by(FrontEnd::kBenchmark)(name);
      });
    } catch (const Error& e) {
      CC_THROW(kInvalidArgument, "--density (read as ", message_without_prefix(e), ")");
    }
  }
  // Said here once; the ranks' own lines of the same text are not repeated.
  std::set<std::string> said;
  for (const UnknownVariable& u : unknown_variables_in_environment()) {  // and misspelt names
    std::cerr << "compcoll-bench allreduce: warning: " << u.message() << "\n";
    said.insert(u.message());
  }
  for (const std::string& m : inert_settings_for_algorithms(cfg, algo_list, process_env())) {
    std::cerr << "compcoll-bench allreduce: warning: " << m << "\n";  // the table says why
    said.insert(m);
  }
  warn_about_what_changes_nothing(split_names("algo", algos), cfg, density, sizes, count,
                                  args.given("count"), forced_hierarchy,
                                  link.empty() ? 1 : hosts,  // without --link: one machine
                                  ranks_per_host);
  check_memory(split_names("algo", algos), largest_count(sizes, count), ranks);
  // The table is the steady state: a tensor's first COMPCOLL_WARMUP_STEPS
  // calls run denser on purpose (training accuracy, docs/convergence.md), and
  // a handful of timed calls would time only those. The ranks inherit this;
  // a value the user set is kept and said.
  // Empty counts as unset, as for every variable (plugin/config.h).
  const char* warmup_steps = std::getenv("COMPCOLL_WARMUP_STEPS");
  const bool warmup_from_user = warmup_steps != nullptr && *warmup_steps != '\0';
  if (!warmup_from_user) setenv("COMPCOLL_WARMUP_STEPS", "0", 1);
  kill_children_on_signals();  // Ctrl-C stops the ranks too (first, then the network)
  // The ranks bind their tcp device from these (with --link, to their
  // namespace's address instead: said below).
  CC_CHECK(!link.empty() || cfg.iface.empty() || cfg.hostname.empty(), kInvalidArgument,
           "COMPCOLL_IFACE=", cfg.iface, " and COMPCOLL_HOSTNAME=", cfg.hostname, " are both set: "
           "the ranks' tcp device binds to an interface or to an address, so unset one of them");
  std::unique_ptr<ShapedNetwork> net;
  if (!link.empty()) {
    CC_CHECK(rendezvous.empty() || rendezvous.rfind("file://", 0) == 0, kInvalidArgument,
             "--link: ranks in their namespaces cannot reach the host's loopback; use the default "
             "FileStore or a file:// --rendezvous");
    for (const char* bound : {"COMPCOLL_IFACE", "COMPCOLL_HOSTNAME"}) {
      const char* v = std::getenv(bound);
      if (v != nullptr && *v != '\0') {
        std::cerr << "compcoll-bench allreduce: warning: " << bound << "=" << v
                  << " changes nothing with --link: each rank binds its namespace's address\n";
      }
    }
    net = std::make_unique<ShapedNetwork>(hosts, parse_link_rate(link));
    ShapedNetwork::install_teardown_on_signals();  // Ctrl-C removes the namespaces too
  }

  // Removed on every way out, Ctrl-C included (process.h).
  const RunDir run_dir;
  const std::string dir = run_dir.path();
  const std::string spec = rendezvous.empty() ? "file://" + dir + "/store" : rendezvous;
  const std::string out = dir + "/results.json";
  if (!plot.empty() && !plotter_ready(dir)) return 1;
  const double load_at_start = load_average();  // before the ranks add theirs

  std::vector<Child> children;
  const ReapOnExit reap(children);  // destroyed before run_dir: no rank writes into a removed dir
  const std::string exe = self_exe();
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> a;
    if (net) {
      // Rank r runs inside its host's namespace and binds its tcp device
      // there; the host's first rank meters its interface.
      const int host = r / static_cast<int>(ranks_per_host);
      a = net->exec_prefix(host);
      a.insert(a.end(), {"/usr/bin/env", "-u", "COMPCOLL_IFACE",
                         "COMPCOLL_HOSTNAME=" + net->address(host)});
    }
    a.insert(a.end(), {exe, "worker", "--rank", std::to_string(r), "--ranks",
                                  std::to_string(ranks), "--rendezvous", spec, "--algo", algos,
                                  "--count", std::to_string(count), "--iters", std::to_string(iters),
                                  "--warmup", std::to_string(warmup),
                                  "--gradient", gradient, "--seed", std::to_string(seed), "--out", out});
    if (!density.empty()) {
      a.push_back("--density");
      a.push_back(density);
    }
    if (!sizes.empty()) {
      a.push_back("--sizes");
      a.push_back(sizes);
    }
    if (net) {
      a.insert(a.end(), {"--tx-iface", "eth0", "--ranks-per-host", std::to_string(ranks_per_host)});
    }
    if (probe_link) a.push_back("--probe-link");
    if (r == 0 && isatty(STDERR_FILENO) == 1) a.push_back("--progress");  // TerminalProgress
    if (!hierarchy.empty()) a.insert(a.end(), {"--hierarchy", hierarchy});
    children.push_back(spawn(a, r, dir + "/rank" + std::to_string(r) + ".log"));
    watch_child(children.back().pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  TerminalProgress progress(out + ".progress");
  const bool ok = wait_all(children, deadline, cfg.timeout + std::chrono::seconds(5),
                           [&] { progress.poll(); });
  progress.clear();
  if (!ok) {
    for (Child& c : children) {  // name the flag behind the deadline
      if (c.killed_because == "the run's deadline passed") {
        c.killed_because += " (--deadline " + std::to_string(deadline_s) + " s)";
      }
    }
    std::cerr << "compcoll-bench allreduce: failed; per rank:\n";
    for (const Child& c : children) {
      std::cerr << "  rank " << c.rank << ": " << describe_status(c) << "\n";
    }
    for (const Child& c : children) {
      if (c.status == 0) continue;
      // The run's directory, the log's too, is removed on the way out.
      std::cerr << "--- rank " << c.rank << " log (its end; removed with the run's directory) ---\n" << tail_of(c.log);
    }
    return 1;
  }
  pass_on_rank_logs(children, cfg.debug, said);
  if (!json) {
    std::cout << (warmup_from_user
                      ? "# COMPCOLL_WARMUP_STEPS=" + std::string(std::getenv("COMPCOLL_WARMUP_STEPS")) +
                            " from the environment: calls inside a tensor's warm-up are timed as such\n"
                      : "# steady state: the ranks run with COMPCOLL_WARMUP_STEPS=0 (a tensor's first " +
                            std::to_string(cfg.params.warmup_steps) +
                            " calls are denser by default; set the variable to time them)\n");
  }
  if (!json) std::cout << machine_load_line(load_at_start);
  if (net && !json) {
    std::cout << "# link: " << hosts << " network namespaces (" << ranks_per_host
              << " rank(s) each) on a bridge, every link shaped with tbf to " << net->rate().text
              << " (198.18.0.0/24)\n";
  }
  std::cout << read_file(json ? out : out + ".txt") << std::flush;
  if (!plot.empty()) {
    const std::string title = "compcoll-bench allreduce, " + std::to_string(ranks) + " ranks, " +
                              (link.empty() ? std::string("loopback") : link + " links");
    Child p = spawn({"/usr/bin/env", "python3", COMPCOLL_SOURCE_DIR "/scripts/plot_bench.py", out,
                     plot, title},
                    0, dir + "/plot.log");
    watch_child(p.pid);
    std::vector<Child> plotter{p};
    const ReapOnExit reap_plotter(plotter);
    if (!wait_all(plotter, std::chrono::steady_clock::now() + std::chrono::seconds(120),
                  std::chrono::seconds(1))) {
      std::cerr << "compcoll-bench allreduce: --plot failed: " << tail_of(dir + "/plot.log") << "\n";
      return 1;
    }
    std::cerr << "plot written to " << plot << "\n";
  }
  return 0;
}

}  // namespace compcoll::bench
