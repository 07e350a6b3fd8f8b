#include "plugin/nccl_interposer/stats_report.h"

#include <sstream>

namespace compcoll::interposer {

std::string stats_json(const std::string& algo, int origin_rank,
                       const std::vector<CommSnapshot>& comms) {
  StatsCounters total;
  uint64_t forwarded_calls = 0, state_bytes = 0;
  int world_size = -1;
  std::ostringstream list;
  for (size_t i = 0; i < comms.size(); ++i) {
    const CommSnapshot& c = comms[i];
    total.add(c.counters);
    forwarded_calls += c.forwarded_calls;
    if (!c.destroyed) state_bytes += c.state_bytes;
    if (c.parent < 0 && world_size < 0) world_size = c.size;
    list << (i ? ", " : "") << "{\"id\": " << c.id << ", \"parent\": " << c.parent
         << ", \"rank\": " << c.rank << ", \"size\": " << c.size << ", ";
    write_counters_json(list, c.counters);
    list << ", \"forwarded_calls\": " << c.forwarded_calls
         << ", \"state_entries\": " << c.state_entries << ", \"state_bytes\": " << c.state_bytes
         << ", \"destroyed\": " << (c.destroyed ? "true" : "false") << "}";
  }
  std::ostringstream os;
  os << "{\"rank\": " << origin_rank << ", \"world_size\": " << world_size << ", \"algo\": \""
     << algo << "\", ";
  write_counters_json(os, total);
  os << ", \"forwarded_calls\": " << forwarded_calls << ", \"state_bytes\": " << state_bytes
     << ", \"communicators\": [" << list.str() << "]}";
  return os.str();
}

}  // namespace compcoll::interposer
