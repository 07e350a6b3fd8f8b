// compcoll's single C++ error style: every failure is a compcoll::Error
// (or a subclass) carrying a message that names the problem and, where it is
// known, the values involved and the rank. The C ABI converts these into
// status codes; no exception crosses it.
#pragma once

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace compcoll {

// Kinds let callers (the C API, the PyTorch backend) map errors to codes
// without parsing messages.
enum class ErrorKind {
  kInvalidArgument,  // bad configuration or call arguments
  kMalformedPayload, // a peer sent bytes that do not decode
  kTransport,        // a peer died, a socket broke, a timeout expired
  kMismatch,         // ranks disagree on configuration
  kUnsupported,      // feature not available on this build/machine
  kInternal,         // a broken invariant inside compcoll
};

const char* error_kind_name(ErrorKind kind);

// e's message without the "compcoll: " that every Error's starts with, for a
// caller that puts it inside a message of its own (a tool's prefix, a
// context); other exceptions' messages as they are.
std::string message_without_prefix(const std::exception& e);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A transport error whose cause is a deadline that passed: the rendezvous
// waited for a rank that never came, or a call made no progress in time.
// limit() is the limit that expired, so that a layer that knows which
// setting set it (COMPCOLL_TIMEOUT_MS) can name that setting without
// reading the message. Its kind stays kTransport: to a caller mapping
// kinds to codes a timeout is a peer that is gone or stuck.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, std::chrono::milliseconds limit)
      : Error(ErrorKind::kTransport, what), limit_(limit) {}
  std::chrono::milliseconds limit() const { return limit_; }

 private:
  std::chrono::milliseconds limit_;
};

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line,
                              const std::string& msg);
[[noreturn]] void throw_timeout(std::chrono::milliseconds limit, const std::string& msg);

}  // namespace detail
}  // namespace compcoll

// CC_THROW(kind, parts...) throws an Error whose message is the parts joined.
#define CC_THROW(kind, ...)                                              \
  ::compcoll::detail::throw_error(::compcoll::ErrorKind::kind, __FILE__, \
                                  __LINE__,                              \
                                  ::compcoll::detail::concat(__VA_ARGS__))

// CC_THROW_TIMEOUT(limit, parts...) throws a TimeoutError for `limit`.
#define CC_THROW_TIMEOUT(limit, ...) \
  ::compcoll::detail::throw_timeout((limit), ::compcoll::detail::concat(__VA_ARGS__))

// CC_CHECK(cond, kind, parts...) throws when cond is false.
#define CC_CHECK(cond, kind, ...)          \
  do {                                     \
    if (!(cond)) CC_THROW(kind, __VA_ARGS__); \
  } while (0)

// Gloo-style comparison checks that report both values: "a vs b".
#define CC_CHECK_CMP(a, op, b, kind, ...)                                 \
  do {                                                                    \
    const auto& cc_a_ = (a);                                              \
    const auto& cc_b_ = (b);                                              \
    if (!(cc_a_ op cc_b_))                                                \
      CC_THROW(kind, __VA_ARGS__, " (" #a " " #op " " #b ": ", cc_a_, " vs ", \
               cc_b_, ")");                                               \
  } while (0)
#define CC_CHECK_EQ(a, b, kind, ...) CC_CHECK_CMP(a, ==, b, kind, __VA_ARGS__)
#define CC_CHECK_LE(a, b, kind, ...) CC_CHECK_CMP(a, <=, b, kind, __VA_ARGS__)
#define CC_CHECK_LT(a, b, kind, ...) CC_CHECK_CMP(a, <, b, kind, __VA_ARGS__)
#define CC_CHECK_GE(a, b, kind, ...) CC_CHECK_CMP(a, >=, b, kind, __VA_ARGS__)
