// What the environment holds that changes nothing, said to the user: a
// variable the configured algorithm does not read, or reads only under
// another setting (inert_settings); a misspelt COMPCOLL_* name
// (unknown_variables, with the nearest real one); every setting while
// compcoll is off (settings_unread_while_off). The table they read is
// config.cc's.
#include <unistd.h>  // environ

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/registry.h"
#include "plugin/config.h"

namespace compcoll {

std::vector<std::string_view> tuned_algorithms(const ConfigVar& var) {
  const std::string_view list = var.tunes;
  if (list.empty() || list == kTunesCompressed) return {};
  std::vector<std::string_view> names;
  for (size_t start = 0;;) {  // every comma splits, so "dgc," lists an empty name
    const size_t comma = list.find(',', start);
    names.push_back(list.substr(start, comma - start));
    if (comma == std::string_view::npos) return names;
    start = comma + 1;
  }
}

bool tunes(const ConfigVar& var, const Config& cfg) {
  if (!*var.tunes) return true;  // a setting of the communicator itself
  const auto in_use = algorithms_in_use(cfg);
  if (std::string_view(var.tunes) == kTunesCompressed) return !in_use.empty();
  for (const std::string_view name : tuned_algorithms(var)) {
    if (std::find(in_use.begin(), in_use.end(), name) != in_use.end()) return true;
  }
  return false;
}

std::string tunes_in_words(const ConfigVar& var) {
  if (std::string_view(var.tunes) == kTunesCompressed) return "every algorithm but dense";
  std::string words;
  for (const std::string_view name : tuned_algorithms(var)) {
    if (!words.empty()) words += ", ";
    words += name;
  }
  return words;
}

const char* front_end_name(FrontEnd f) {
  switch (f) {
    case FrontEnd::kAny: return "any front end";
    case FrontEnd::kStandalone: return "the C API";
    case FrontEnd::kBenchmark: return "compcoll-bench";
    case FrontEnd::kTorchBackend: return "the PyTorch backend's groups";
    case FrontEnd::kNcclInterposer: return "the NCCL interposer's communicators";
  }
  return "?";
}

namespace {

// Why a front end does not read var (one of its ignored_by).
std::string ignored_because(const ConfigVar& var, FrontEnd f) {
  if (var.ignored_because != nullptr) return var.ignored_because;
  if (f == FrontEnd::kTorchBackend) {
    return "the process group gives the rank, the world size, the store where ranks meet and "
           "the Gloo device (GLOO_SOCKET_IFNAME picks its interface)";
  }
  if (f == FrontEnd::kBenchmark) {
    return "it starts its ranks itself: --ranks gives the world size and each rank its rank, "
           "and they meet in a fresh directory (or --rendezvous)";
  }
  return "the NCCL communicator gives the rank, the world size and the network (NCCL_SOCKET_IFNAME "
         "and NCCL's own settings)";
}

}  // namespace

std::string ignored_by_in_words(const ConfigVar& var) {
  std::string words;
  for (const FrontEnd f : {FrontEnd::kStandalone, FrontEnd::kBenchmark, FrontEnd::kTorchBackend,
                           FrontEnd::kNcclInterposer}) {
    if ((var.ignored_by & bit(f)) == 0) continue;
    // "the C API, nor by compcoll-bench, nor by the PyTorch backend's groups".
    if (!words.empty()) words += ", nor by ";
    words += front_end_name(f);
  }
  return words;
}

std::vector<std::string> inert_settings(const Config& cfg, const EnvLookup& env) {
  std::vector<std::string> out;
  for (const ConfigVar& var : config_table()) {
    const std::optional<std::string> value = env(var.name);
    if (!value || value->empty()) continue;
    if (var.ignored_by & bit(cfg.front_end)) {
      out.push_back(std::string(var.name) + "=" + *value + " changes nothing for " +
                    front_end_name(cfg.front_end) + ": " + ignored_because(var, cfg.front_end));
      continue;
    }
    if (tunes(var, cfg)) {
      if (var.idle_because == nullptr) continue;
      if (const char* why = var.idle_because(cfg)) {
        out.push_back(std::string(var.name) + "=" + *value + " changes nothing " + why);
      }
      continue;
    }
    std::string m = std::string(var.name) + "=" + *value + " changes nothing ";
    if (!cfg.compression_enabled()) {
      m += "while COMPCOLL_ALGO is dense or unset: nothing is compressed";
    } else {
      m += "for COMPCOLL_ALGO=" + cfg.algo;
      if (cfg.algo == "auto") m += " with COMPCOLL_AUTO_ALGO=" + cfg.params.auto_algo;
    }
    // "dense or unset: nothing is compressed" already says why for the
    // variables of every compressed algorithm.
    if (cfg.compression_enabled() || std::string_view(var.tunes) != kTunesCompressed) {
      m += " (it tunes " + tunes_in_words(var) + ")";
    }
    out.push_back(std::move(m));
  }
  // Read, but only to turn compression off: no payload describes a tensor
  // above 2^32 - 1 elements (compression/payload.h), so none is compressed.
  // (Not idle_because: it still enters the ranks' agreement.)
  if (cfg.compression_enabled() && cfg.min_elems > 0xFFFFFFFFull) {
    out.push_back("COMPCOLL_MIN_ELEMS=" + std::to_string(cfg.min_elems) + " is above the largest "
                  "tensor compcoll compresses (2^32 - 1 elements), so every call goes exact: "
                  "COMPCOLL_ALGO=" + cfg.algo + " changes nothing (unset it to say so)");
  }
  return out;
}

std::vector<std::string> inert_settings_for_algorithms(const Config& cfg,
                                                       const std::vector<std::string>& algos,
                                                       const EnvLookup& env) {
  std::vector<std::string> out;
  std::string rows;
  for (const std::string& a : algos) rows += (rows.empty() ? "" : ", ") + a;
  for (const ConfigVar& var : config_table()) {
    const std::optional<std::string> value = env(var.name);
    if (!value || value->empty()) continue;
    const std::string set = std::string(var.name) + "=" + *value + " changes nothing ";
    if (var.ignored_by & bit(cfg.front_end)) {
      out.push_back(set + "for " + front_end_name(cfg.front_end) + ": " +
                    ignored_because(var, cfg.front_end));
      continue;
    }
    if (std::string_view(var.tunes).empty()) continue;  // the communicator's own: read
    bool read = false;
    const char* idle = nullptr;
    for (const std::string& a : algos) {
      Config row = cfg;
      row.algo = a;
      if (!tunes(var, row)) continue;
      const char* why = var.idle_because != nullptr ? var.idle_because(row) : nullptr;
      if (why == nullptr) read = true;
      else idle = why;
    }
    if (read) continue;
    if (idle != nullptr) {
      out.push_back(set + idle);
    } else {
      out.push_back(set + "for this run's algorithms (" + rows + "): it tunes " +
                    tunes_in_words(var));
    }
  }
  return out;
}

std::vector<std::string> inert_setting_warnings_once(const Config& cfg) {
  static std::mutex mu;
  static std::set<std::string> reported;
  std::vector<std::string> fresh;
  const std::vector<std::string> all = inert_settings(cfg, process_env());
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& m : all) {
    if (reported.insert(m).second) fresh.push_back(m);
  }
  return fresh;
}

namespace {

constexpr ToolVar kToolVars[] = {
    {"COMPCOLL_VENV", "scripts/python-env.sh, install-deps.sh: the project's virtual environment"},
    {"COMPCOLL_PYTHON", "scripts/install-deps.sh: the interpreter that makes the environment"},
    {"COMPCOLL_ROOT", "scripts/python-env.sh: the source tree"},
    {"COMPCOLL_SANITIZE", "setup.py: build the Python extension with sanitizers"},
    {"COMPCOLL_CI_QUICK", "scripts/run-tests.sh: skip the slow steps"},
    {"COMPCOLL_RELIABILITY_SEED", "tests/reliability: seed of the fault sequence"},
    {"COMPCOLL_RELIABILITY_CALLS", "tests/reliability: calls per run"},
    {"COMPCOLL_RELIABILITY_TIMEOUT_MS", "tests/reliability: per-call timeout of the ranks"},
    {"COMPCOLL_NETNS_TEST_HELPER", "tests/network: a test binary's helper mode"},
    {"COMPCOLL_WHEEL_DIR", "tests/python/test_packaging.py: where the built wheel lies"},
    {"COMPCOLL_TEST_REAL_NCCL", "tests/gpu: the real NCCL library the GpuInterposer tests use"},
};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}


constexpr std::string_view kPrefix = "COMPCOLL_";

// The nearest name of the table when it is close enough to be a slip: at
// most 2 edits, or a third of the longer name after the prefix (so
// COMPCOLL_TIMEOUT finds COMPCOLL_TIMEOUT_MS, COMPCOLL_FOO finds nothing);
// a name that stops or goes on at a word boundary (COMPCOLL_STATS for
// COMPCOLL_STATS_FILE) counts as one edit, one that spells a name out
// (COMPCOLL_ALGORITHM for COMPCOLL_ALGO) as two. Compared case-insensitively:
// COMPCOLL_Algo is COMPCOLL_ALGO.
std::string nearest_name(const std::string& name) {
  const std::string u = upper(name).substr(kPrefix.size());
  std::string best;
  size_t best_d = std::string::npos;
  for (const ConfigVar& v : config_table()) {
    const std::string known = std::string(v.name).substr(kPrefix.size());
    const bool word_prefix = known.rfind(u + "_", 0) == 0 || u.rfind(known + "_", 0) == 0;
    // The name spelled out (COMPCOLL_ALGORITHM for COMPCOLL_ALGO): two edits,
    // so that a true slip of the same name still wins.
    const bool spelled_out = known.size() >= 4 && u.size() > known.size() && u.rfind(known, 0) == 0;
    const size_t d = word_prefix ? 1 : spelled_out ? 2 : edit_distance(u, known);
    const size_t limit = std::max<size_t>(2, std::max(u.size(), known.size()) / 3);
    if (d <= limit && d < best_d) {
      best_d = d;
      best = v.name;
    }
  }
  return best;
}

}  // namespace

// Optimal string alignment distance (config.h) (Levenshtein plus adjacent
// transpositions, the commonest typo): "DENSTIY" is 1 from "DENSITY".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::span<const ToolVar> tool_variables() { return kToolVars; }

std::string UnknownVariable::message() const {
  std::string m = name + " is not a compcoll variable and is ignored";
  if (!suggestion.empty()) m += "; did you mean " + suggestion + "?";
  else m += " (compcoll-info lists the variables)";
  return m;
}

namespace {

std::vector<std::string> environment_entries() {
  std::vector<std::string> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) entries.emplace_back(*e);
  return entries;
}

bool is_tool_variable(const std::string& name) {
  for (const ToolVar& t : kToolVars) {
    if (name == t.name) return true;
  }
  return false;
}

}  // namespace

std::vector<UnknownVariable> unknown_variables(const std::vector<std::string>& entries) {
  std::vector<UnknownVariable> out;
  for (const std::string& e : entries) {
    const std::string name = e.substr(0, e.find('='));
    if (name.rfind(kPrefix, 0) != 0) {
      // A slip in the prefix itself (COMPCOL_ALGO, COMPCOLLALGO,
      // compcoll_algo) would otherwise pass without a word: named with the
      // variable meant.
      const std::string u = upper(name);
      if (u.rfind("COMPCOL", 0) != 0) continue;
      size_t rest = 7;
      if (rest < u.size() && u[rest] == 'L') ++rest;
      if (rest < u.size() && (u[rest] == '_' || u[rest] == '-')) ++rest;
      if (rest >= u.size()) continue;
      // Only where it is near a variable's name: COMPCOLLECTOR_HOME is not ours.
      const std::string meant = nearest_name(std::string(kPrefix) + u.substr(rest));
      if (!meant.empty()) out.push_back({name, meant});
      continue;
    }
    bool known = is_tool_variable(name);
    for (const ConfigVar& v : config_table()) known = known || name == v.name;
    if (!known) out.push_back({name, nearest_name(name)});
  }
  return out;
}

std::vector<UnknownVariable> unknown_variables_in_environment() {
  return unknown_variables(environment_entries());
}

std::string settings_unread_while_off(const std::vector<std::string>& entries,
                                      const std::string& what_runs,
                                      const std::vector<std::string>& read_anyway) {
  std::string algo;
  std::vector<std::string> unread;
  for (const std::string& e : entries) {
    const size_t eq = e.find('=');
    const std::string name = e.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : e.substr(eq + 1);
    if (name.rfind(kPrefix, 0) != 0 || is_tool_variable(name)) continue;
    if (std::find(read_anyway.begin(), read_anyway.end(), name) != read_anyway.end()) continue;
    if (name == "COMPCOLL_ALGO") {
      algo = value;
      continue;
    }
    // Long values (paths) would drown the names the user is looking for.
    unread.push_back(name + "=" + (value.size() > 48 ? value.substr(0, 45) + "..." : value));
  }
  if (unread.empty()) return {};
  std::string m = algo.empty() ? "COMPCOLL_ALGO is unset" : "COMPCOLL_ALGO=" + algo;
  m += ", so compcoll is off and " + what_runs + ": ";
  for (size_t i = 0; i < unread.size(); ++i) {
    m += (i == 0 ? "" : i + 1 == unread.size() ? " and " : ", ") + unread[i];
  }
  m += unread.size() == 1 ? " changes nothing" : " change nothing";
  for (const UnknownVariable& u : unknown_variables(entries)) m += "; " + u.message();
  std::string compressed;
  for (const auto& a : algorithm_table()) {
    if (std::string_view(a.name) != "dense") compressed += (compressed.empty() ? "" : ", ") + std::string(a.name);
  }
  return m + "; set COMPCOLL_ALGO to one of " + compressed + " to compress (said once per process)";
}

std::string settings_unread_while_off_in_environment(const std::string& what_runs,
                                                     const std::vector<std::string>& read_anyway) {
  return settings_unread_while_off(environment_entries(), what_runs, read_anyway);
}

std::vector<std::string> unknown_variable_warnings_once() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return {};
  std::vector<std::string> out;
  for (const UnknownVariable& u : unknown_variables_in_environment()) out.push_back(u.message());
  return out;
}

}  // namespace compcoll
