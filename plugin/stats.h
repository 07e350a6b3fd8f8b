// Traffic accounting of one communicator: per call and cumulative bytes a
// dense allreduce would have sent ("dense") against what was sent ("wire"),
// the ratio, and time. Written as JSON to COMPCOLL_STATS_FILE (with {rank}
// replaced) and summarised in one log line when the communicator ends.
#pragma once

#include <cstdint>
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

class Stats {
 public:
  void record(const CallRecord& c);

  uint64_t calls() const { return calls_; }
  uint64_t compressed_calls() const { return compressed_calls_; }
  uint64_t warmup_dense_calls() const { return warmup_dense_calls_; }
  uint64_t dense_bytes() const { return dense_bytes_; }
  uint64_t wire_bytes() const { return wire_bytes_; }
  double total_ms() const { return total_ms_; }
  double ratio() const { return wire_bytes_ ? double(dense_bytes_) / double(wire_bytes_) : 0.0; }
  // The same over the calls made after their tensor's warm-up (dense routes
  // included): what compression sends once it is in its steady state, the
  // figure the benchmark's tables show. 0 before any such call.
  uint64_t steady_calls() const { return steady_calls_; }
  uint64_t steady_dense_bytes() const { return steady_dense_bytes_; }
  uint64_t steady_wire_bytes() const { return steady_wire_bytes_; }
  double steady_ratio() const {
    return steady_wire_bytes_ ? double(steady_dense_bytes_) / double(steady_wire_bytes_) : 0.0;
  }
  const CallRecord& last() const { return last_; }
  double last_density() const { return last_density_; }

  // {"rank":..,"algo":..,"calls":..,"compressed_calls":..,
  //  "warmup_dense_calls":..,"steady_calls":..,"steady_ratio":..,
  //  "dense_bytes":..,"wire_bytes":..,"ratio":..,"time_ms":..,"state_bytes":..,"world_size":..,
  //  "last_density":..} -- last_density: selected / elements of the last
  //  compressed call (what the warm-up decided; 1 for onebit, which sends a
  //  sign per element), or 0 before any.
  std::string json(int rank, int world_size, const std::string& algo, uint64_t state_bytes) const;
  std::string summary(const std::string& algo) const;

 private:
  uint64_t calls_ = 0;
  uint64_t compressed_calls_ = 0;
  uint64_t warmup_dense_calls_ = 0;
  uint64_t steady_calls_ = 0;
  uint64_t steady_dense_bytes_ = 0;
  uint64_t steady_wire_bytes_ = 0;
  uint64_t dense_bytes_ = 0;
  uint64_t wire_bytes_ = 0;
  double total_ms_ = 0.0;
  CallRecord last_;
  double last_density_ = 0.0;
};

// pattern with every "{rank}" replaced by rank.
std::string stats_path(const std::string& pattern, int rank);

// Writes text to path atomically (temporary file, then rename). Returns
// false (and leaves errno) on failure; callers log, never throw at exit.
bool write_file_atomically(const std::string& path, const std::string& text);

// Why a file could not be written at path later ("" = it can): its directory
// cannot be created (it is created when missing, as write_file_atomically
// will not), is not writable, or the path is a directory. Checked when a
// communicator is created, so that a long run does not end with its stats
// lost and a warning nobody reads.
std::string output_file_problem(const std::string& path);

}  // namespace compcoll
