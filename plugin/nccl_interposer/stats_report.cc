#include "plugin/nccl_interposer/stats_report.h"

#include <sstream>

namespace compcoll::interposer {
namespace {

double ratio(uint64_t dense, uint64_t wire) { return wire ? double(dense) / double(wire) : 0.0; }

// The warm-up's share, as the plugin's stats file has it (plugin/stats.h).
std::string steady_fields(const CommSnapshot& c) {
  std::ostringstream os;
  os << ", \"warmup_dense_calls\": " << c.warmup_dense_calls
     << ", \"steady_calls\": " << c.steady_calls
     << ", \"steady_ratio\": " << ratio(c.steady_dense_bytes, c.steady_wire_bytes);
  return os.str();
}

}  // namespace

std::string stats_json(const std::string& algo, int origin_rank,
                       const std::vector<CommSnapshot>& comms) {
  CommSnapshot total;
  int world_size = -1;
  std::ostringstream list;
  for (size_t i = 0; i < comms.size(); ++i) {
    const CommSnapshot& c = comms[i];
    total.calls += c.calls;
    total.compressed_calls += c.compressed_calls;
    total.forwarded_calls += c.forwarded_calls;
    total.warmup_dense_calls += c.warmup_dense_calls;
    total.steady_calls += c.steady_calls;
    total.steady_dense_bytes += c.steady_dense_bytes;
    total.steady_wire_bytes += c.steady_wire_bytes;
    total.dense_bytes += c.dense_bytes;
    total.wire_bytes += c.wire_bytes;
    total.ms += c.ms;
    if (!c.destroyed) total.state_bytes += c.state_bytes;
    if (c.parent < 0 && world_size < 0) world_size = c.size;
    list << (i ? ", " : "") << "{\"id\": " << c.id << ", \"parent\": " << c.parent
         << ", \"rank\": " << c.rank << ", \"size\": " << c.size << ", \"calls\": " << c.calls
         << ", \"compressed_calls\": " << c.compressed_calls
         << ", \"forwarded_calls\": " << c.forwarded_calls << steady_fields(c)
         << ", \"dense_bytes\": " << c.dense_bytes
         << ", \"wire_bytes\": " << c.wire_bytes << ", \"ratio\": " << ratio(c.dense_bytes, c.wire_bytes)
         << ", \"time_ms\": " << c.ms << ", \"state_entries\": " << c.state_entries
         << ", \"state_bytes\": " << c.state_bytes
         << ", \"destroyed\": " << (c.destroyed ? "true" : "false") << "}";
  }
  std::ostringstream os;
  os << "{\"rank\": " << origin_rank << ", \"world_size\": " << world_size << ", \"algo\": \""
     << algo << "\", \"calls\": " << total.calls << ", \"compressed_calls\": "
     << total.compressed_calls << ", \"forwarded_calls\": " << total.forwarded_calls
     << steady_fields(total)
     << ", \"dense_bytes\": " << total.dense_bytes << ", \"wire_bytes\": " << total.wire_bytes
     << ", \"ratio\": " << ratio(total.dense_bytes, total.wire_bytes) << ", \"time_ms\": " << total.ms
     << ", \"state_bytes\": " << total.state_bytes << ", \"communicators\": [" << list.str() << "]}";
  return os.str();
}

}  // namespace compcoll::interposer
