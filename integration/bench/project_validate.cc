// `compcoll-bench project --validate`: the projection against real runs on
// this machine. For each rank count it runs `compcoll-bench allreduce --link
// RATE --json` (this binary; ranks in network namespaces, root needed) once
// per sparse pattern, pinned with COMPCOLL_SPARSE_PATTERN so the row and the
// projected variant are the same thing, and prints measured and projected
// time per call, the error (projected / measured - 1) and the wire bytes of
// both. The projection for this machine shares its cores among the ranks
// (ProjectionInputs::cores), as the real runs do.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "compcoll/error.h"
#include "integration/bench/json.h"
#include "integration/bench/process.h"
#include "integration/bench/project.h"

namespace compcoll::bench {
namespace {

constexpr double kTarget = 0.30;  // the bound on |error|

// The flat objects of `allreduce --json` as key -> raw value text.
std::vector<std::map<std::string, std::string>> parse_rows(const std::string& json) {
  std::vector<std::map<std::string, std::string>> rows;
  size_t pos = 0;
  while ((pos = json.find('{', pos)) != std::string::npos) {
    const size_t end = json.find('}', pos);
    CC_CHECK(end != std::string::npos, kInternal, "allreduce --json: unterminated object");
    std::map<std::string, std::string> row;
    size_t p = pos + 1;
    while (p < end) {
      const size_t k0 = json.find('"', p);
      if (k0 == std::string::npos || k0 >= end) break;
      const size_t k1 = json.find('"', k0 + 1);
      const size_t colon = json.find(':', k1);
      const size_t v0 = json.find_first_not_of(' ', colon + 1);
      const size_t v1 = json[v0] == '"' ? json.find('"', v0 + 1) + 1 : json.find_first_of(",}", v0);
      row[json.substr(k0 + 1, k1 - k0 - 1)] = json.substr(v0, v1 - v0);
      p = v1;
    }
    rows.push_back(row);
    pos = end + 1;
  }
  return rows;
}

// One `allreduce` run; returns its rows or throws with the end of its log.
std::vector<std::map<std::string, std::string>> run_allreduce(
    const std::string& dir, int ranks, const LinkRate& link, size_t count, const std::string& algos,
    const std::string& pattern, int iters, const std::string& density) {
  std::vector<std::string> argv{"/usr/bin/env", "COMPCOLL_SPARSE_PATTERN=" + pattern, self_exe(),
                                "allreduce", "--ranks", std::to_string(ranks), "--link", link.text,
                                "--count", std::to_string(count), "--algo", algos, "--iters",
                                std::to_string(iters), "--probe-link", "--json"};
  if (!density.empty()) argv.insert(argv.end(), {"--density", density});
  const std::string log = dir + "/allreduce-" + std::to_string(ranks) + "-" + pattern + ".log";
  std::fprintf(stderr, "compcoll-bench project --validate: %d ranks, %s, pattern %s...\n", ranks,
               algos.c_str(), pattern.c_str());
  std::vector<Child> run{spawn(argv, 0, log)};
  watch_child(run[0].pid);
  const bool ok = wait_all(run, std::chrono::steady_clock::now() + std::chrono::minutes(20),
                           std::chrono::seconds(1));
  CC_CHECK(ok, kInternal, "project --validate: `allreduce --ranks ", ranks, " --link ", link.text,
           "` failed (", describe_status(run[0].status), "):\n", tail_of(log));
  // stderr carries the ranks' progress lines; the JSON list starts at '['.
  const std::string out = read_file(log);
  const size_t start = out.find("[{");
  CC_CHECK(start != std::string::npos, kInternal, "project --validate: no JSON in:\n", tail_of(log));
  return parse_rows(out.substr(start));
}

}  // namespace

int validate_projection(const std::vector<Variant>& variants, const std::vector<int>& ranks,
                        const LinkRate& link, const ProjectionInputs& in, int iters, bool json,
                        const std::string& density_flag) {
  CC_CHECK(geteuid() == 0, kUnsupported,
           "project --validate runs `allreduce --link`, which needs root (network namespaces); "
           "run as root, or project without --validate");
  // Which algorithms each pattern's run needs.
  std::map<std::string, std::string> algos_by_pattern;  // "allgather" also runs the others
  for (const Variant& v : variants) {
    const std::string pattern = v.pattern.empty() ? "allgather" : v.pattern;
    std::string& list = algos_by_pattern[pattern];
    if (list.find(v.algo) == std::string::npos) list += (list.empty() ? "" : ",") + v.algo;
  }
  char tmpl[] = "/tmp/compcoll-validate-XXXXXX";
  CC_CHECK(mkdtemp(tmpl) != nullptr, kInternal, "cannot create a temporary directory");
  const std::string dir = tmpl;

  struct Row {
    Projection projected;
    double measured_ms = 0.0;
    double measured_wire = 0.0;
    double error() const { return projected.time_s() * 1e3 / measured_ms - 1.0; }
  };
  std::vector<Row> rows;
  // Text rows are printed as each run finishes (a 16-rank run takes minutes
  // on a small machine); JSON comes at the end.
  auto print_row = [&](const Row& row) {
    std::printf(" %6d %16s %12.2f %12.2f %7.1f%% %14.0f %14.0f%s\n", row.projected.ranks,
                row.projected.variant.label().c_str(), row.measured_ms,
                row.projected.time_s() * 1e3, row.error() * 100.0, row.measured_wire,
                row.projected.wire_bytes, std::fabs(row.error()) <= kTarget ? "" : "  (outside ±30%)");
    std::fflush(stdout);
  };
  if (!json) {
    std::printf("# compcoll-bench project --validate: %zu float32 at %s, %d timed calls per run; "
                "projection with the ranks sharing %d cores and the latencies (alpha, alpha_ring) "
                "each run measured as auto does\n",
                in.count, link.text.c_str(), iters, in.cores);
    std::printf("#%6s %16s %12s %12s %8s %14s %14s\n", "ranks", "variant", "measured_ms",
                "projected_ms", "error", "wire_measured", "wire_projected");
  }
  for (int r : ranks) {
    for (const auto& [pattern, algos] : algos_by_pattern) {
      const auto measured = run_allreduce(dir, r, link, in.count, algos, pattern, iters, density_flag);
      if (!json && !measured.empty()) {
        std::printf("#   %d ranks, pattern %s: measured alpha %s ms, alpha_ring %s ms\n", r,
                    pattern.c_str(), measured[0].at("link_alpha_ms").c_str(),
                    measured[0].at("link_alpha_ring_ms").c_str());
      }
      for (const auto& m : measured) {
        std::string algo = m.at("algo");
        algo = algo.substr(1, algo.size() - 2);  // unquote
        Variant v{algo, ""};
        if (algo == "dgc" || algo == "sdagc" || algo == "sbc") v.pattern = pattern;
        Row row;
        // This machine's latencies, measured in the run as auto does.
        ProjectionInputs here = in;
        here.measured_latency = LinkModel{std::strtod(m.at("link_alpha_ring_ms").c_str(), nullptr) * 1e-3,
                                          std::strtod(m.at("link_alpha_ms").c_str(), nullptr) * 1e-3,
                                          0.0};
        row.projected = project_one(v, r, link, here);
        row.measured_ms = std::strtod(m.at("time_ms").c_str(), nullptr);
        row.measured_wire = std::strtod(m.at("wire_bytes").c_str(), nullptr);
        rows.push_back(row);
        if (!json) print_row(row);
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  int within = 0;
  for (const Row& row : rows) within += std::fabs(row.error()) <= kTarget;
  if (json) {
    std::vector<JsonObject> items;
    for (const Row& row : rows) {
      JsonObject j;
      j.add("algo", row.projected.variant.algo)
          .add("pattern", row.projected.variant.pattern)
          .add("ranks", row.projected.ranks)
          .add("link", link.text)
          .add("count", in.count)
          .add("measured_ms", row.measured_ms)
          .add("projected_ms", row.projected.time_s() * 1e3)
          .add("error", row.error())
          .add("measured_wire_bytes", row.measured_wire)
          .add("projected_wire_bytes", row.projected.wire_bytes);
      items.push_back(j);
    }
    std::cout << json_list(items) << std::endl;
  } else {
    std::printf("# %d of %zu within ±%.0f%%\n", within, rows.size(), kTarget * 100.0);
  }
  return 0;
}

}  // namespace compcoll::bench
