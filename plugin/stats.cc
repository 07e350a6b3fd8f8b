#include "plugin/stats.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace compcoll {

void Stats::record(const CallRecord& c) {
  ++calls_;
  compressed_calls_ += c.compressed;
  warmup_dense_calls_ += c.warmup_dense;
  if (!c.in_warmup) {
    ++steady_calls_;
    steady_dense_bytes_ += c.dense_bytes;
    steady_wire_bytes_ += c.wire_bytes;
  }
  dense_bytes_ += c.dense_bytes;
  wire_bytes_ += c.wire_bytes;
  total_ms_ += c.ms;
  last_ = c;
  if (c.compressed && c.elements) last_density_ = double(c.selected) / double(c.elements);
}

std::string Stats::json(int rank, int world_size, const std::string& algo,
                        uint64_t state_bytes) const {
  std::ostringstream os;
  os << "{\"rank\": " << rank << ", \"world_size\": " << world_size << ", \"algo\": \"" << algo
     << "\", \"calls\": " << calls_ << ", \"compressed_calls\": " << compressed_calls_
     << ", \"warmup_dense_calls\": " << warmup_dense_calls_ << ", \"steady_calls\": " << steady_calls_
     << ", \"steady_ratio\": " << steady_ratio()
     << ", \"dense_bytes\": " << dense_bytes_ << ", \"wire_bytes\": " << wire_bytes_
     << ", \"ratio\": " << ratio() << ", \"time_ms\": " << total_ms_
     << ", \"state_bytes\": " << state_bytes << ", \"last_density\": " << last_density_ << "}";
  return os.str();
}

std::string Stats::summary(const std::string& algo) const {
  // Nothing dense to compare with (a lone rank, or no call yet): "ratio 0.0x"
  // would read as "compression made it worse".
  char ratio_text[32];
  if (dense_bytes_ == 0) {
    std::snprintf(ratio_text, sizeof ratio_text, "n/a");
  } else {
    std::snprintf(ratio_text, sizeof ratio_text, "%.1fx", ratio());
  }
  // With warm-up calls in the run, the whole-run ratio undersells the
  // steady state: give both.
  char steady_text[64] = "";
  if (steady_calls_ != calls_ && steady_wire_bytes_ != 0) {
    std::snprintf(steady_text, sizeof steady_text, " (%.1fx after the warm-up)", steady_ratio());
  }
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s: %llu calls (%llu compressed), %.3f MB on the wire vs %.3f MB dense, ratio "
                "%s%s, %.1f ms in allreduce",
                algo.c_str(), static_cast<unsigned long long>(calls_),
                static_cast<unsigned long long>(compressed_calls_), wire_bytes_ / 1e6,
                dense_bytes_ / 1e6, ratio_text, steady_text, total_ms_);
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

bool write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return false;
    f << text << "\n";
    if (!f.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::string output_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return "it is a directory";
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  fs::create_directories(dir, ec);
  if (ec) return "cannot create its directory " + dir.string() + ": " + ec.message();
  if (!fs::is_directory(dir, ec)) return dir.string() + " exists and is not a directory";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return "its directory " + dir.string() + " is not writable: " + std::strerror(errno);
  }
  return {};
}

}  // namespace compcoll
