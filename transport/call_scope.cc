#include "transport/call_scope.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <utility>

#include "compcoll/error.h"

namespace compcoll {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

CallScope::CallScope(GlooComm& comm, const char* op)
    : comm_(comm), op_(op) {
  comm_.check_usable(op);
  tag_ = comm_.next_tag_++;
  call_ = ++comm_.calls_;
  deadline_ = steady_clock::now() + comm_.timeout_;
}

CallScope::~CallScope() = default;

milliseconds CallScope::remaining() const {
  const auto left = std::chrono::ceil<milliseconds>(deadline_ - steady_clock::now());
  return std::max(left, milliseconds(1));
}

void CallScope::send(int peer, const void* data, size_t n, uint8_t phase) {
  if (n == 0) return;
  const uint64_t slot = ::gloo::Slot::build(kCompcollSlotPrefix, tag_) + phase;
  gloo_call(detail::concat("posting a send to rank ", peer), [&] {
    // Gloo only reads from a buffer it sends; the cast is for its API.
    auto buf = comm_.context_->createUnboundBuffer(const_cast<void*>(data), n);
    buf->send(peer, slot);
    ops_.push_back(Op{std::move(buf), peer, n, true});
    comm_.note_sent(n);
  });
}

void CallScope::recv(int peer, void* data, size_t n, uint8_t phase) {
  if (n == 0) return;
  const uint64_t slot = ::gloo::Slot::build(kCompcollSlotPrefix, tag_) + phase;
  gloo_call(detail::concat("posting a receive from rank ", peer), [&] {
    auto buf = comm_.context_->createUnboundBuffer(data, n);
    buf->recv(peer, slot);
    ops_.push_back(Op{std::move(buf), peer, n, false});
  });
}

void CallScope::wait_all() {
  // Receives first: a dead peer is noticed on the read side, while a send
  // to it may sit in the socket buffer and look fine.
  std::stable_partition(ops_.begin(), ops_.end(),
                        [](const Op& o) { return !o.is_send; });
  for (Op& o : ops_) {
    const milliseconds left = remaining();
    bool done = false;
    try {
      done = o.is_send ? o.buf->waitSend(left) : o.buf->waitRecv(left);
    } catch (const std::exception& e) {
      fail_from_gloo(detail::concat(o.is_send ? "sending " : "receiving ",
                                    o.bytes,
                                    o.is_send ? " bytes to rank " : " bytes from rank ",
                                    o.peer),
                     o.peer, e.what());
    } catch (...) {
      fail_from_gloo(detail::concat("waiting on rank ", o.peer), o.peer,
                     "unknown exception from Gloo");
    }
    if (!done) {
      // Only abortWait*() makes Gloo return false; nobody calls it, but a
      // silent false would hand back an unfilled buffer, so treat it as fatal.
      fail(detail::concat("Gloo aborted the wait on rank ", o.peer));
    }
  }
  ops_.clear();
}

void CallScope::fail_from_gloo(const std::string& what, int peer,
                               const std::string& gloo_msg) {
  std::string text = what + " failed";
  // Gloo says a timeout only in its message.
  const bool timed_out = gloo_msg.find("Timed out") != std::string::npos;
  if (timed_out) {
    text += detail::concat(" (no progress within the ", comm_.timeout_.count(),
                             " ms timeout: ",
                             peer >= 0 ? detail::concat("rank ", peer)
                                       : std::string("a peer"),
                             " may be dead, hung or not calling ", op_, ")");
  } else if (gloo_msg.find("by peer") != std::string::npos) {
    text += " (the peer's connection went down: that process died, or it hit "
            "an error of its own and closed its connections; its log says which)";
  }
  fail(text + ": " + gloo_msg, timed_out);
}

void CallScope::fail(const std::string& text, bool timed_out) {
  // Drop our buffers before the connections go down.
  ops_.clear();
  comm_.fail(detail::concat(op_, " (call ", call_, ", tag ", tag_, "): ",
                            text), timed_out);
}

}  // namespace compcoll
