// Logging in NCCL_DEBUG's style: "compcoll INFO [rank 3] message" on stderr
// ("[pid N]" before a rank is known), filtered by COMPCOLL_DEBUG (WARN, INFO,
// TRACE). A Logger belongs to a communicator; there is no global logger to
// configure.
#pragma once

#include <string>

#include "compcoll/error.h"
#include "plugin/config.h"

namespace compcoll {

class Logger {
 public:
  Logger(LogLevel level, int rank) : level_(level), rank_(rank) {}
  bool enabled(LogLevel l) const { return l <= level_; }
  void set_rank(int rank) { rank_ = rank; }
  void write(LogLevel l, const std::string& msg) const;

  template <typename... Args>
  void warn(Args&&... args) const {
    write(LogLevel::kWarn, detail::concat(std::forward<Args>(args)...));
  }
  template <typename... Args>
  void info(Args&&... args) const {
    if (enabled(LogLevel::kInfo)) write(LogLevel::kInfo, detail::concat(std::forward<Args>(args)...));
  }
  template <typename... Args>
  void trace(Args&&... args) const {
    if (enabled(LogLevel::kTrace)) write(LogLevel::kTrace, detail::concat(std::forward<Args>(args)...));
  }

 private:
  LogLevel level_;
  int rank_;
};

}  // namespace compcoll
