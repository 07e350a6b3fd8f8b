#include "integration/pytorch/csrc/group_stats.h"

#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "integration/pytorch/csrc/lane.h"
#include "plugin/stats.h"

namespace compcoll::torch_integration {
namespace {

void write_sums(std::ostringstream& os, const LaneStats& x) {
  write_counters_json(os, x.counters);
  os << ", \"state_bytes\": " << x.state;
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

void LaneStats::add(const LaneStats& other) {
  counters.add(other.counters);
  state += other.state;
  direct += other.direct;
}

bool read_lane_stats(const Lane& lane, LaneStats* out) {
  LaneStats x;
  x.name = lane.name();
  if (const Communicator* c = lane.comm()) {
    x.counters = c->stats().counters();
    x.state = c->state_bytes();
  }
  x.direct = lane.direct_calls();
  if (lane.comm() == nullptr && x.direct == 0) return false;
  x.counters.add_dense_calls(x.direct, lane.direct_bytes());
  *out = x;
  return true;
}

std::string group_stats_json(const GroupStats& g) {
  LaneStats total;
  std::ostringstream devices;
  bool first = true;
  for (const LaneStats& x : g.lanes) {
    total.add(x);
    devices << (first ? "" : ", ") << quoted(x.name) << ": {";
    write_head(devices, g.rank, g.world_size, g.algo);
    write_sums(devices, x);
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
     << ", \"loss_scale_changes\": " << g.loss_scale_changes << ", \"devices\": {" << devices.str() << "}}";
  return os.str();
}

bool record_group_stats(const std::string& path, int rank, int world_size, const GroupStats& g) {
  Book& b = book();
  std::lock_guard<std::mutex> lock(b.mu);
  auto& groups = b.files[path];
  // Each backend records once, when it finishes: a name recorded before is
  // an earlier group of the process that torch named alike (the process
  // group destroyed and created again), whose counts are kept beside.
  std::string key = g.group;
  for (int n = 2; groups.count(key) != 0; ++n) key = detail::concat(g.group, " (", n, ")");
  groups[key] = g;

  LaneStats total;
  std::map<std::string, LaneStats> lanes;
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
