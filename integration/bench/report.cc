#include "integration/bench/report.h"

#include <cmath>
#include <cstdio>

#include "integration/bench/json.h"

namespace compcoll::bench {
namespace {

// "n/a" where the ratio is undefined (see AllreduceResult::ratio).
std::string ratio_text(double ratio) {
  if (std::isnan(ratio)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", ratio);
  return buf;
}

}  // namespace

std::string results_json(const std::vector<AllreduceResult>& results) {
  std::vector<JsonObject> items;
  for (const auto& r : results) {
    JsonObject j;
    j.add("algo", r.algo)
        .add("hierarchy", r.hierarchy)
        .add("ranks", r.ranks)
        .add("count", r.count)
        .add("iters", r.iters)
        .add("time_ms", r.time_ms)
        .add("dense_time_ms", r.dense_time_ms)
        .add("cpu_ms", r.cpu_ms)
        .add("dense_cpu_ms", r.dense_cpu_ms)
        .add("speedup", r.speedup())
        .add("wire_bytes", static_cast<unsigned long long>(r.wire_bytes))
        .add("dense_wire_bytes", static_cast<unsigned long long>(r.dense_wire_bytes))
        .add("ratio", r.ratio())
        .add("rel_error", r.rel_error)
        .add("running_rel_error", r.running_rel_error)
        .add("identical", r.identical);
    if (!r.decision.empty()) j.add("decision", r.decision);
    if (r.has_host_tx) {
      j.add("host_tx_bytes", static_cast<unsigned long long>(r.host_tx_bytes))
          .add("ranks_per_host", r.ranks_per_host)
          .add("hosts", r.hosts);
    }
    if (r.link_alpha_ms >= 0) {
      j.add("link_alpha_ms", r.link_alpha_ms)
          .add("link_alpha_ring_ms", r.link_alpha_ring_ms)
          .add("link_beta_ns", r.link_beta_ns);
    }
    items.push_back(j);
  }
  return json_list(items);
}

std::string results_table(const std::vector<AllreduceResult>& results) {
  std::string out;
  char line[512];
  if (results.empty()) return out;
  std::snprintf(line, sizeof line,
                "# compcoll-bench allreduce: %d ranks, float sum, median of %d calls "
                "(slowest rank); dense = Gloo's own allreduce in the same run\n",
                results[0].ranks, results[0].iters);
  out += line;
  // With --link, host_tx(B) closes each row: the busiest namespace's
  // interface, per call (from the kernel's counters, see host_counters.h).
  const bool host_tx = results[0].has_host_tx;
  if (host_tx) {
    std::snprintf(line, sizeof line,
                  "# %d ranks per host (network namespace), %d hosts; host_tx = bytes the busiest "
                  "host's interface sent per call\n",
                  results[0].ranks_per_host, results[0].hosts);
    out += line;
  }
  std::snprintf(line, sizeof line, "#%12s %10s %6s %5s %9s %10s %9s %8s %8s %10s %8s %12s %8s %9s %9s %5s",
                "size(B)", "count", "type", "redop", "algo", "time(ms)", "cpu(ms)", "algbw", "busbw",
                "dense(ms)", "speedup", "wire(B)", "ratio", "rel_err", "run_err", "same");
  out += line;
  out += host_tx ? "   host_tx(B)\n" : "\n";
  std::snprintf(line, sizeof line, "#%12s %10s %6s %5s %9s %10s %9s %8s %8s %10s %8s %12s %8s %9s %9s %5s",
                "", "(elements)", "", "", "", "", "(ranks)", "(GB/s)", "(GB/s)", "", "(x)", "(per rank)", "(x)",
                "(L2 rel)", "(L2 rel)", "");
  out += line;
  out += host_tx ? "   (per host)\n" : "\n";
  for (const auto& r : results) {
    const double bytes = double(r.count) * 4.0;
    const double algbw = r.time_ms > 0 ? bytes / (r.time_ms * 1e6) : 0.0;
    const double busbw = algbw * (r.ranks > 1 ? 2.0 * (r.ranks - 1) / r.ranks : 0.0);
    std::snprintf(line, sizeof line,
                  " %12.0f %10zu %6s %5s %9s %10.2f %9.2f %8.3f %8.3f %10.2f %8.2f %12llu %8s %9.2e %9.2e %5s",
                  bytes, r.count, "float", "sum", r.label().c_str(), r.time_ms, r.cpu_ms, algbw, busbw,
                  r.dense_time_ms, r.speedup(), static_cast<unsigned long long>(r.wire_bytes),
                  ratio_text(r.ratio()).c_str(), r.rel_error, r.running_rel_error,
                  r.identical ? "yes" : "NO");
    out += line;
    if (host_tx) {
      std::snprintf(line, sizeof line, " %12llu", static_cast<unsigned long long>(r.host_tx_bytes));
      out += line;
    }
    out += "\n";
    // What the row's algorithm decided in its last timed call (auto: the
    // algorithm; dgc and sdagc: the pattern; csc and onebit: warm-up or not).
    if (!r.decision.empty()) out += "#   " + r.label() + "'s last call: " + r.decision + "\n";
  }
  return out;
}

}  // namespace compcoll::bench
