// What the sparsifying codecs (dgc, sdagc, sbc) have in common: a per-tensor
// error-feedback state and an encode step that consumes one gradient and
// produces one payload. Decoding is format-driven (decode.h), so a receiver
// needs no codec object. csc and onebit are driven step by step by their
// collectives and expose their own functions (csc.h, onebit.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compcoll/types.h"

namespace compcoll {

struct CodecState;

// Error-feedback memory that a device codec holds in device memory while it
// runs the tensor (the NCCL interposer's GPU codecs, collectives/device_route.h).
// While a CodecState has one, its host v and u are released and stale; the
// residency is the truth until to_host() brings it back.
class DeviceResidency {
 public:
  virtual ~DeviceResidency() = default;
  virtual size_t size() const = 0;          // elements
  virtual size_t memory_bytes() const = 0;  // device bytes held
  virtual uint64_t steps() const = 0;       // encodes so far (CodecState::steps)
  // Writes v, u, steps and lambda back into host (resizing v and u).
  virtual void to_host(CodecState& host) = 0;
};

// Error-feedback memory of one tensor on one rank.
struct CodecState {
  explicit CodecState(size_t n) : v(n, 0.0f) {}

  std::vector<float> v;  // accumulated, not yet sent (the residual)
  std::vector<float> u;  // momentum-corrected velocity; empty when momentum is off
  // COMPCOLL_MOMENTUM_HANDOVER: the mirror of the caller's optimizer momentum
  // buffer (collectives/momentum_handover.h); empty when the hand-over is off.
  std::vector<float> handed;
  uint64_t steps = 0;    // encodes so far (drives warm-up and sample offsets)
  float lambda = 0.0f;   // sdagc: threshold in units of sigma, adapted per step
  // The scatter pattern's index regions (P+1 boundaries), rebalanced every
  // call from the owners' demand; identical on every rank (collectives/sparse_scatter.h).
  std::vector<size_t> regions;
  // Normalized selection (SparsifyConfig::second_moment_beta > 0): an
  // exponential moving average of each element's squared gradient, made at
  // the first encode that uses it; empty otherwise (second_moment.h).
  std::vector<float> second_moment;

  // Set while the state lives in device memory (see DeviceResidency).
  std::unique_ptr<DeviceResidency> device;

  size_t size() const { return device ? device->size() : v.size(); }
  uint64_t step_count() const { return device ? device->steps() : steps; }
  // Host and device bytes.
  size_t memory_bytes() const {
    return (v.capacity() + u.capacity() + handed.capacity() + second_moment.capacity()) *
               sizeof(float) +
           regions.capacity() * sizeof(size_t) + (device ? device->memory_bytes() : 0);
  }
  // Brings a device-resident state back to host memory (a host codec, a
  // checkpoint or a merge is about to read it); nothing when it is there.
  void bring_to_host() {
    if (!device) return;
    device->to_host(*this);
    device.reset();
  }
};

// Statistics of the last encode, for logging and tests.
struct EncodeInfo {
  double density = 0.0;   // target density of this step (warm-up included)
  size_t wanted = 0;      // k
  size_t sent = 0;        // entries in the payload
  float threshold = 0.0f; // key threshold that produced the selection
};

// Buffers to add to a gradient over [off, off + len) before it is used: the
// host hierarchy's leader holds its host's other ranks' parts of the last
// round of the local reduce in shared memory (collectives/hierarchical.h).
// A codec that takes them forms the host sum inside its own pass over the
// gradient, instead of the sum being written into the gradient and read
// back: one write and one read of the tensor fewer on a leader. Element i
// of the sum is ((grad[i] + parts[0][i - off]) + parts[1][i - off]) + ...,
// the bits that adding them into grad first gives.
struct Addends {
  std::vector<const float*> parts;  // each holds len floats, for [off, off + len)
  size_t off = 0;
  size_t len = 0;

  bool empty() const { return parts.empty() || len == 0; }
  // The sum at element i of a gradient of which these are the addends.
  float sum_at(const float* grad, size_t i) const {
    float x = grad[i];
    if (i - off < len) {  // unsigned: false below off too
      for (const float* p : parts) x += p[i - off];
    }
    return x;
  }
};

// grad[off, off + len) += the addends, in their order (where the consumer
// of grad cannot take them in its own pass).
void add_addends(float* grad, const Addends& addends);

class SparseCodec;
// codec's encode of grad + addends: in the codec's own pass where it fuses
// them, else after add_addends(grad, addends). Either way the same bits.
EncodeInfo encode_with_addends(const SparseCodec& codec, float* grad, const Addends& addends,
                               size_t n, CodecState& state, Bytes& payload);

class SparseCodec {
 public:
  virtual ~SparseCodec() = default;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<CodecState> make_state(size_t n) const = 0;
  // Adds grad (n floats) to state, selects, writes the payload (overwritten)
  // and removes what was sent from the state.
  virtual EncodeInfo encode(const float* grad, size_t n, CodecState& state,
                            Bytes& payload) const = 0;
  // Whether encode_sum() takes addends in its own pass (with this codec's
  // configuration); where not, the caller adds them into grad first.
  virtual bool fuses_addends() const { return false; }
  // encode() of grad + addends, with the bits encode() gives after
  // add_addends(grad, addends); grad itself is not written. Only where
  // fuses_addends().
  virtual EncodeInfo encode_sum(const float* grad, const Addends& addends, size_t n,
                                CodecState& state, Bytes& payload) const;
};

// The number of entries a step at density d sends out of n: at least one for
// a non-empty tensor, so tiny tensors still make progress.
size_t target_count(double density, size_t n);

}  // namespace compcoll
