#include "compcoll/error.h"

#include <string>
#include <string_view>

namespace compcoll {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kMalformedPayload: return "malformed payload";
    case ErrorKind::kTransport: return "transport error";
    case ErrorKind::kMismatch: return "configuration mismatch";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kInternal: return "internal error";
  }
  return "unknown error";
}

std::string message_without_prefix(const std::exception& e) {
  constexpr std::string_view kPrefix = "compcoll: ";
  std::string what = e.what();
  if (what.rfind(kPrefix, 0) == 0) what.erase(0, kPrefix.size());
  return what;
}

namespace detail {

void throw_error(ErrorKind kind, const char* file, int line,
                 const std::string& msg) {
  (void)file;
  (void)line;
  throw Error(kind, std::string("compcoll: ") + msg);
}

void throw_timeout(std::chrono::milliseconds limit, const std::string& msg) {
  throw TimeoutError(std::string("compcoll: ") + msg, limit);
}

}  // namespace detail
}  // namespace compcoll
