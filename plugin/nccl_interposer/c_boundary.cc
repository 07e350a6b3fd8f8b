#include "plugin/nccl_interposer/c_boundary.h"

#include "plugin/logging.h"

namespace compcoll::interposer {
namespace {

thread_local std::string t_last_error;

}  // namespace

ncclResult_t to_nccl_result(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return ncclInvalidArgument;
    case ErrorKind::kMalformedPayload: return ncclRemoteError;
    case ErrorKind::kTransport: return ncclRemoteError;
    case ErrorKind::kMismatch: return ncclInvalidUsage;
    case ErrorKind::kUnsupported: return ncclInvalidUsage;
    case ErrorKind::kInternal: return ncclInternalError;
  }
  return ncclInternalError;
}

const std::string& last_error() { return t_last_error; }

void clear_last_error() { t_last_error.clear(); }

ncclResult_t fail_with(ncclResult_t r, const std::string& where, const std::string& msg) {
  t_last_error = where + ": " + msg;
  // Failures are always worth a line, whatever COMPCOLL_DEBUG says.
  Logger(LogLevel::kWarn, -1).warn(t_last_error);
  return r;
}

}  // namespace compcoll::interposer
