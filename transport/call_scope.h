// CallScope: the bookkeeping of one GlooComm call (internal to transport/).
//
// A call owns one tag. Point-to-point messages of the call use the Gloo slot
// Slot::build(kCompcollSlotPrefix, tag) + phase, where phase numbers the
// rounds inside the call (sizes with eager payloads, then the rest; barrier rounds). Every posted
// operation gets its own UnboundBuffer so that a failure can be pinned on the
// peer it was exchanging with. Waits get the time left to the call's deadline.
//
// Any exception out of Gloo (gloo::IoException, gloo::EnforceNotMet, ...) is
// converted by fail(): the communicator is marked broken and a
// compcoll::Error(kTransport) naming the call, the peer and Gloo's message is
// thrown.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "transport/gloo_comm.h"

namespace gloo::transport {
class UnboundBuffer;
}  // namespace gloo::transport

namespace compcoll {

// Gloo's own algorithms use slot prefixes 0x01..0x08; ours is distinct so a
// caller mixing gloo::allgather etc. with compcoll calls can never collide.
inline constexpr uint8_t kCompcollSlotPrefix = 0x43;

class CallScope {
 public:
  // Throws kTransport when the communicator is already broken.
  CallScope(GlooComm& comm, const char* op);
  ~CallScope();

  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  uint32_t tag() const { return tag_; }
  // Time left to the deadline, at least 1 ms (Gloo reads 0 as "no timeout").
  std::chrono::milliseconds remaining() const;

  // Post a send/recv of n bytes to/from peer in round `phase`. n == 0 posts
  // nothing: both sides know the size, so nothing is expected either.
  void send(int peer, const void* data, size_t n, uint8_t phase);
  void recv(int peer, void* data, size_t n, uint8_t phase);
  // Wait for every posted operation (receives first), then forget them.
  void wait_all();

  // Run f (which calls into Gloo); convert anything it throws.
  template <typename F>
  void gloo_call(const std::string& what, F&& f) {
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_from_gloo(what, -1, e.what());
    } catch (...) {
      fail_from_gloo(what, -1, "unknown exception from Gloo");
    }
  }

  // Marks the communicator broken and throws kTransport with context (a
  // TimeoutError when timed_out).
  [[noreturn]] void fail(const std::string& detail, bool timed_out = false);
  // fail() for an exception out of Gloo while doing `what` (with `peer`, or
  // -1 when Gloo's algorithm hides it); explains timeouts.
  [[noreturn]] void fail_from_gloo(const std::string& what, int peer,
                                   const std::string& gloo_msg);

 private:
  struct Op {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
    int peer;
    size_t bytes;
    bool is_send;
  };

  GlooComm& comm_;
  const char* op_;
  uint32_t tag_;
  uint64_t call_;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<Op> ops_;
};

}  // namespace compcoll
