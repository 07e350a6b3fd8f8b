#include "plugin/logging.h"

#include <unistd.h>

#include <cstdio>

namespace compcoll {

void Logger::write(LogLevel l, const std::string& msg) const {
  const char* tag = l == LogLevel::kWarn ? "WARN" : l == LogLevel::kInfo ? "INFO" : "TRACE";
  // One fprintf per line so lines of concurrent ranks do not interleave.
  // Before a rank is known (the NCCL interposer at load time), the process
  // tells several preloaded processes apart.
  if (rank_ < 0) {
    std::fprintf(stderr, "compcoll %s [pid %d] %s\n", tag, static_cast<int>(::getpid()),
                 msg.c_str());
  } else if (group_.empty()) {
    std::fprintf(stderr, "compcoll %s [rank %d] %s\n", tag, rank_, msg.c_str());
  } else {
    std::fprintf(stderr, "compcoll %s [rank %d, group '%s'] %s\n", tag, rank_, group_.c_str(),
                 msg.c_str());
  }
}

}  // namespace compcoll
