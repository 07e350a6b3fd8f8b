#include "plugin/logging.h"

#include <cstdio>

namespace compcoll {

void Logger::write(LogLevel l, const std::string& msg) const {
  const char* tag = l == LogLevel::kWarn ? "WARN" : l == LogLevel::kInfo ? "INFO" : "TRACE";
  // One fprintf per line so lines of concurrent ranks do not interleave.
  std::fprintf(stderr, "compcoll %s [rank %d] %s\n", tag, rank_, msg.c_str());
}

}  // namespace compcoll
