// Logging in NCCL_DEBUG's style: "compcoll INFO [rank 3] message" on stderr
// ("[pid N]" before a rank is known, "[rank 0, group '3']" in a subgroup), filtered by COMPCOLL_DEBUG (WARN, INFO,
// TRACE). A Logger belongs to a communicator; there is no global logger to
// configure.
#pragma once

#include <string>
#include <utility>

#include "compcoll/error.h"
#include "plugin/config.h"

namespace compcoll {

class Logger {
 public:
  Logger(LogLevel level, int rank, std::string group = {})
      : level_(level), rank_(rank), group_(std::move(group)) {}
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
  // A group other than the job's world (a torch subgroup): its ranks are
  // the group's, so "[rank 0, group '3']" says whose rank 0 speaks.
  std::string group_;
};

}  // namespace compcoll
