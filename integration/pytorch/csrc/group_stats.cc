#include "integration/pytorch/csrc/group_stats.h"

#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "integration/pytorch/csrc/lane.h"
#include "plugin/stats.h"

namespace compcoll::torch_integration {
namespace {

// The sums of several lanes (or groups).
struct Sums {
  uint64_t calls = 0, compressed = 0, dense = 0, wire = 0, state = 0, direct = 0;
  uint64_t warmup_dense = 0;
  uint64_t steady_calls = 0, steady_dense = 0, steady_wire = 0;
  double ms = 0.0;
  double last_density = 0.0;
  void add(const LaneStats& x) {
    calls += x.calls;
    direct += x.direct;
    compressed += x.compressed;
    warmup_dense += x.warmup_dense;
    steady_calls += x.steady_calls;
    steady_dense += x.steady_dense;
    steady_wire += x.steady_wire;
    dense += x.dense;
    wire += x.wire;
    state += x.state;
    ms += x.ms;
    if (x.last_density > 0.0) last_density = x.last_density;
  }
};

void write_sums(std::ostringstream& os, const Sums& x) {
  os << "\"calls\": " << x.calls << ", \"compressed_calls\": " << x.compressed
     << ", \"warmup_dense_calls\": " << x.warmup_dense << ", \"steady_calls\": " << x.steady_calls
     << ", \"steady_ratio\": "
     << (x.steady_wire ? double(x.steady_dense) / double(x.steady_wire) : 0.0)
     << ", \"dense_bytes\": " << x.dense << ", \"wire_bytes\": " << x.wire
     << ", \"ratio\": " << (x.wire ? double(x.dense) / double(x.wire) : 0.0)
     << ", \"time_ms\": " << x.ms << ", \"state_bytes\": " << x.state
     << ", \"last_density\": " << x.last_density;
}

void write_head(std::ostringstream& os, int rank, int world_size, const std::string& algo) {
  os << "\"rank\": " << rank << ", \"world_size\": " << world_size << ", \"algo\": \"" << algo
     << "\", ";
}

// Group names come from torch (digits, or a user's group_desc-free name);
// escape what JSON requires anyway.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

struct Book {
  std::mutex mu;
  // path -> group name -> last recorded stats
  std::map<std::string, std::map<std::string, GroupStats>> files;
};

Book& book() {
  static Book* b = new Book;  // never destroyed: groups may finish during exit
  return *b;
}

}  // namespace

bool read_lane_stats(const Lane& lane, LaneStats* out) {
  LaneStats x;
  x.name = lane.name();
  if (const Communicator* c = lane.comm()) {
    const Stats& s = c->stats();
    x.calls = s.calls();
    x.compressed = s.compressed_calls();
    x.warmup_dense = s.warmup_dense_calls();
    x.steady_calls = s.steady_calls();
    x.steady_dense = s.steady_dense_bytes();
    x.steady_wire = s.steady_wire_bytes();
    x.dense = s.dense_bytes();
    x.wire = s.wire_bytes();
    x.ms = s.total_ms();
    x.state = c->state_bytes();
    x.last_density = s.last_density();
  }
  x.direct = lane.direct_calls();
  if (lane.comm() == nullptr && x.direct == 0) return false;
  x.calls += x.direct;
  x.dense += lane.direct_bytes();
  x.wire += lane.direct_bytes();
  x.steady_calls += x.direct;  // never warm up: dense, past compcoll
  x.steady_dense += lane.direct_bytes();
  x.steady_wire += lane.direct_bytes();
  *out = x;
  return true;
}

std::string group_stats_json(const GroupStats& g) {
  Sums total;
  std::ostringstream devices;
  bool first = true;
  for (const LaneStats& x : g.lanes) {
    total.add(x);
    Sums one;
    one.add(x);
    devices << (first ? "" : ", ") << quoted(x.name) << ": {";
    write_head(devices, g.rank, g.world_size, g.algo);
    write_sums(devices, one);
    devices << ", \"direct_calls\": " << x.direct << "}";
    first = false;
  }
  std::ostringstream os;
  os << "{";
  write_head(os, g.rank, g.world_size, g.algo);
  write_sums(os, total);
  os << ", \"group\": " << quoted(g.group) << ", \"reduce_scatter_calls\": "
     << g.reduce_scatter_calls << ", \"reduce_scatter_elems\": " << g.reduce_scatter_elems
     << ", \"optimizer_momentum\": " << g.optimizer_momentum
     << ", \"optimizer_momentum_moved\": " << (g.optimizer_momentum_moved ? "true" : "false")
     << ", \"devices\": {" << devices.str() << "}}";
  return os.str();
}

bool record_group_stats(const std::string& path, int rank, int world_size, const GroupStats& g) {
  Book& b = book();
  std::lock_guard<std::mutex> lock(b.mu);
  auto& groups = b.files[path];
  groups[g.group] = g;

  Sums total;
  std::map<std::string, Sums> lanes;
  std::set<std::string> algos;
  std::ostringstream each;
  bool first = true;
  for (const auto& [name, stats] : groups) {
    for (const LaneStats& x : stats.lanes) {
      total.add(x);
      lanes[x.name].add(x);
    }
    algos.insert(stats.algo);
    each << (first ? "" : ", ") << quoted(name) << ": " << group_stats_json(stats);
    first = false;
  }
  std::string algo;  // the one algorithm, or all of them ("dgc,onebit")
  for (const std::string& a : algos) algo += (algo.empty() ? "" : ",") + a;

  std::ostringstream os;
  os << "{";
  write_head(os, rank, world_size, algo);
  write_sums(os, total);
  os << ", \"devices\": {";
  first = true;
  for (const auto& [name, sums] : lanes) {
    os << (first ? "" : ", ") << quoted(name) << ": {";
    write_sums(os, sums);
    os << ", \"direct_calls\": " << sums.direct << "}";
    first = false;
  }
  os << "}, \"groups\": {" << each.str() << "}}";
  return write_file_atomically(path, os.str());
}

}  // namespace compcoll::torch_integration
