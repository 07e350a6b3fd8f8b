// Traffic accounting of one communicator: per call and cumulative bytes a
// dense allreduce would have sent ("dense") against what was sent ("wire"),
// the ratio, and time. Written as JSON to COMPCOLL_STATS_FILE (with {rank}
// replaced) and summarised in one log line when the communicator ends.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace compcoll {

struct CallRecord {
  bool compressed = false;
  uint64_t dense_bytes = 0;  // a ring allreduce's bytes per rank for this call
  uint64_t wire_bytes = 0;   // what this rank actually sent
  double ms = 0.0;
  uint64_t elements = 0;     // of the tensor
  uint64_t selected = 0;     // this rank contributed (CallInfo::selected): dgc, sdagc and sbc
                             // send density x elements, the warm-up's density included
  bool warmup_dense = false;  // ran dense: the tensor was in its warm-up (csc, onebit)
  bool in_warmup = false;     // the tensor was in its warm-up, whatever the algorithm sent
};

// A communicator's counters as plain values: what Stats accumulates, what an
// integration's snapshot for another thread holds, and what several
// communicators sum to in one stats file. The one list of these fields, and
// (write_counters_json) the one JSON spelling of them.
struct StatsCounters {
  uint64_t calls = 0;
  uint64_t compressed_calls = 0;
  uint64_t warmup_dense_calls = 0;  // ran dense: the tensor was in its warm-up (csc, onebit)
  // The calls made after their tensor's warm-up (dense routes included), and
  // their bytes: what compression sends once it is in its steady state.
  uint64_t steady_calls = 0, steady_dense_bytes = 0, steady_wire_bytes = 0;
  uint64_t dense_bytes = 0;  // a ring allreduce's bytes per rank, summed over the calls
  uint64_t wire_bytes = 0;   // what this rank sent
  double ms = 0.0;
  // selected / elements of the last compressed call (what the warm-up
  // decided; 1 for onebit, which sends a sign per element), or 0 before any.
  double last_density = 0.0;

  double ratio() const { return wire_bytes ? double(dense_bytes) / double(wire_bytes) : 0.0; }
  double steady_ratio() const {
    return steady_wire_bytes ? double(steady_dense_bytes) / double(steady_wire_bytes) : 0.0;
  }
  // Sums other in; last_density becomes other's when it has one.
  void add(const StatsCounters& other);
  // Calls that went past compcoll, dense (a lane's direct calls): they have
  // no warm-up and send what a dense allreduce sends.
  void add_dense_calls(uint64_t calls, uint64_t bytes);
};

// `"calls": .., "compressed_calls": .., "warmup_dense_calls": ..,
// "steady_calls": .., "steady_ratio": .., "dense_bytes": .., "wire_bytes": ..,
// "ratio": .., "time_ms": .., "last_density": ..`: the fields of an object,
// without braces.
void write_counters_json(std::ostream& os, const StatsCounters& c);

class Stats {
 public:
  void record(const CallRecord& c);

  const StatsCounters& counters() const { return c_; }
  uint64_t calls() const { return c_.calls; }
  uint64_t compressed_calls() const { return c_.compressed_calls; }
  uint64_t warmup_dense_calls() const { return c_.warmup_dense_calls; }
  uint64_t dense_bytes() const { return c_.dense_bytes; }
  uint64_t wire_bytes() const { return c_.wire_bytes; }
  double total_ms() const { return c_.ms; }
  double ratio() const { return c_.ratio(); }
  // StatsCounters::steady_*: 0 before any call past its tensor's warm-up.
  uint64_t steady_calls() const { return c_.steady_calls; }
  uint64_t steady_dense_bytes() const { return c_.steady_dense_bytes; }
  uint64_t steady_wire_bytes() const { return c_.steady_wire_bytes; }
  double steady_ratio() const { return c_.steady_ratio(); }
  const CallRecord& last() const { return last_; }
  double last_density() const { return c_.last_density; }

  // {"rank":..,"world_size":..,"algo":..,<write_counters_json>,"state_bytes":..}
  std::string json(int rank, int world_size, const std::string& algo, uint64_t state_bytes) const;
  std::string summary(const std::string& algo) const;

 private:
  StatsCounters c_;
  CallRecord last_;
};

// pattern with every "{rank}" replaced by rank.
std::string stats_path(const std::string& pattern, int rank);

// The COMPCOLL_STATS_FILE path one communicator writes, unique among the
// live communicators of its process: a second communicator of the same rank
// (two per process, as the C API suggests for two threads) wrote the same
// file and kept only the last to finish. The claim ends with the object.
class StatsFileClaim {
 public:
  StatsFileClaim() = default;
  ~StatsFileClaim();
  StatsFileClaim(const StatsFileClaim&) = delete;
  StatsFileClaim& operator=(const StatsFileClaim&) = delete;
  // Claims `wanted` for `rank`, or, while another live communicator of the
  // process holds it for the same rank, the first free "<stem>-comm<n><ext>"
  // (n = 2, 3, ...). Held for another rank (ranks as threads of one process
  // and no {rank} in the name), it is shared as between processes: the
  // shared-file warning covers it. Returns the path this one writes.
  const std::string& claim(const std::string& wanted, int rank);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool held_ = false;  // path_ is in the process's claims (and released here)
};

// What to say when every process of a job of world_size ranks would write
// one COMPCOLL_STATS_FILE (no {rank} in pattern): it keeps only the last to
// finish. Empty when there is nothing to say.
std::string stats_file_shared_warning(const std::string& pattern, int world_size);

// Writes text to path atomically (temporary file, then rename). Returns
// false (and leaves errno) on failure; callers log, never throw at exit.
bool write_file_atomically(const std::string& path, const std::string& text);

// What a rank's COMPCOLL_STATS_FILE error says (one phrase, kept here so that
// every place that checks the file words it alike).
inline constexpr char kStatsFileCannotBeWritten[] = "COMPCOLL_STATS_FILE cannot be written";

// Why the stats file at path could not be written later, as "PATH: WHY", or
// "" when it can: its directory cannot be created (it is created when
// missing, as write_file_atomically will not), is not writable, or the path
// is a directory. Checked when a communicator is created, so that a long run
// does not end with its stats lost and a warning nobody reads.
std::string stats_file_problem(const std::string& path);

}  // namespace compcoll
