#include "plugin/stats.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "plugin/state_file.h"
#include "plugin/writable_dir.h"

namespace compcoll {

void StatsCounters::add(const StatsCounters& o) {
  calls += o.calls;
  compressed_calls += o.compressed_calls;
  warmup_dense_calls += o.warmup_dense_calls;
  steady_calls += o.steady_calls;
  steady_dense_bytes += o.steady_dense_bytes;
  steady_wire_bytes += o.steady_wire_bytes;
  dense_bytes += o.dense_bytes;
  wire_bytes += o.wire_bytes;
  ms += o.ms;
  if (o.last_density > 0.0) last_density = o.last_density;
}

void StatsCounters::add_dense_calls(uint64_t n, uint64_t bytes) {
  calls += n;
  steady_calls += n;
  dense_bytes += bytes;
  wire_bytes += bytes;
  steady_dense_bytes += bytes;
  steady_wire_bytes += bytes;
}

void write_counters_json(std::ostream& os, const StatsCounters& c) {
  os << "\"calls\": " << c.calls << ", \"compressed_calls\": " << c.compressed_calls
     << ", \"warmup_dense_calls\": " << c.warmup_dense_calls
     << ", \"steady_calls\": " << c.steady_calls << ", \"steady_ratio\": " << c.steady_ratio()
     << ", \"dense_bytes\": " << c.dense_bytes << ", \"wire_bytes\": " << c.wire_bytes
     << ", \"ratio\": " << c.ratio() << ", \"time_ms\": " << c.ms
     << ", \"last_density\": " << c.last_density;
}

void Stats::record(const CallRecord& c) {
  ++c_.calls;
  c_.compressed_calls += c.compressed;
  c_.warmup_dense_calls += c.warmup_dense;
  if (!c.in_warmup) {
    ++c_.steady_calls;
    c_.steady_dense_bytes += c.dense_bytes;
    c_.steady_wire_bytes += c.wire_bytes;
  }
  c_.dense_bytes += c.dense_bytes;
  c_.wire_bytes += c.wire_bytes;
  c_.ms += c.ms;
  last_ = c;
  if (c.compressed && c.elements) c_.last_density = double(c.selected) / double(c.elements);
}

std::string Stats::json(int rank, int world_size, const std::string& algo,
                        uint64_t state_bytes) const {
  std::ostringstream os;
  os << "{\"rank\": " << rank << ", \"world_size\": " << world_size << ", \"algo\": \"" << algo
     << "\", ";
  write_counters_json(os, c_);
  os << ", \"state_bytes\": " << state_bytes << "}";
  return os.str();
}

std::string Stats::summary(const std::string& algo) const {
  // Nothing dense to compare with (a lone rank, or no call yet): "ratio 0.0x"
  // would read as "compression made it worse".
  char ratio_text[32];
  if (c_.dense_bytes == 0) {
    std::snprintf(ratio_text, sizeof ratio_text, "n/a");
  } else {
    std::snprintf(ratio_text, sizeof ratio_text, "%.1fx", ratio());
  }
  // With warm-up calls in the run, the whole-run ratio undersells the
  // steady state: give both.
  char steady_text[64] = "";
  if (c_.steady_calls != c_.calls && c_.steady_wire_bytes != 0) {
    std::snprintf(steady_text, sizeof steady_text, " (%.1fx after the warm-up)", steady_ratio());
  }
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s: %llu calls (%llu compressed), %.3f MB on the wire vs %.3f MB dense, ratio "
                "%s%s, %.1f ms in allreduce",
                algo.c_str(), static_cast<unsigned long long>(c_.calls),
                static_cast<unsigned long long>(c_.compressed_calls), c_.wire_bytes / 1e6,
                c_.dense_bytes / 1e6, ratio_text, steady_text, c_.ms);
  return buf;
}

std::string stats_path(const std::string& pattern, int rank) {
  std::string out = pattern;
  const std::string tag = "{rank}";
  for (size_t p = out.find(tag); p != std::string::npos; p = out.find(tag, p)) {
    out.replace(p, tag.size(), std::to_string(rank));
  }
  return out;
}

namespace {
// Leaked, as the claims: a communicator destroyed after static destructors
// (a static object of the program's) still locks a live mutex.
std::mutex& stats_claims_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, int>& stats_claims() {  // path -> the rank writing it
  static auto* claims = new std::map<std::string, int>;
  return *claims;
}
}  // namespace

StatsFileClaim::~StatsFileClaim() {
  if (!held_) return;
  std::lock_guard<std::mutex> lock(stats_claims_mu());
  stats_claims().erase(path_);
}

const std::string& StatsFileClaim::claim(const std::string& wanted, int rank) {
  std::lock_guard<std::mutex> lock(stats_claims_mu());
  if (held_) stats_claims().erase(path_);
  held_ = false;
  path_ = wanted;
  const auto other = stats_claims().find(wanted);
  if (other != stats_claims().end() && other->second != rank) return path_;  // shared, as said
  const std::filesystem::path p(wanted);
  // Bounded: far more communicators than any process keeps alive at once.
  for (int n = 2; stats_claims().count(path_) != 0 && n < 100000; ++n) {
    path_ = (p.parent_path() / (p.stem().string() + "-comm" + std::to_string(n) +
                                p.extension().string()))
                .string();
  }
  held_ = stats_claims().emplace(path_, rank).second;
  return path_;
}

std::string stats_file_shared_warning(const std::string& pattern, int world_size) {
  if (pattern.empty() || world_size <= 1 || pattern.find("{rank}") != std::string::npos) return {};
  return "COMPCOLL_STATS_FILE=" + pattern + " has no {rank}: all " + std::to_string(world_size) +
         " ranks write that one file and it keeps the last to finish; put {rank} in the name "
         "for a file per rank (said once per process)";
}

bool write_file_atomically(const std::string& path, const std::string& text) {
  const std::string line = text + "\n";
  return write_binary_file_atomically(
      path, {reinterpret_cast<const uint8_t*>(line.data()), line.size()});
}

std::string stats_file_problem(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path + ": it is a directory";
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const DirCheck check = prepare_writable_dir(dir.string());
  const std::string where = path + ": ";
  switch (check.problem) {
    case DirCheck::Problem::kNone: return {};
    case DirCheck::Problem::kCannotCreate:
      return where + "cannot create its directory " + dir.string() + ": " + check.reason;
    case DirCheck::Problem::kNotADirectory:
      return where + dir.string() + " exists and is not a directory";
    case DirCheck::Problem::kNotWritable:
      return where + "its directory " + dir.string() + " is not writable: " + check.reason;
  }
  return {};
}

}  // namespace compcoll
