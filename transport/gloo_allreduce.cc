// GlooComm::allreduce: Gloo's own gloo::allreduce (ring, in place) with the
// element kernel chosen by reduce_function(). Using Gloo's algorithm and, for
// float32 SUM, Gloo's own kernel means compcoll's dense path returns exactly
// the bits a plain Gloo user would get for the same inputs and world size.
#include <gloo/allreduce.h>
#include <gloo/context.h>

#include <algorithm>
#include <limits>

#include "compcoll/error.h"
#include "transport/call_scope.h"
#include "transport/gloo_comm.h"
#include "transport/reduce_ops.h"

namespace compcoll {

namespace {

// Gloo only needs the element size from the type; these stand in for the
// 1-, 2-, 4- and 8-byte dtypes.
template <typename T>
void set_output(gloo::AllreduceOptions& opts, void* buf, size_t count) {
  opts.setOutput(static_cast<T*>(buf), count);
}

}  // namespace

// What gloo::allreduce's ring (Gloo 2022, allreduce.cc) makes rank `rank`
// send for `total` bytes: the buffer is cut into numSegments segments, P
// chunks of numSegments/P segments each; reduce-scatter sends every chunk
// but this rank's own, allgather every chunk but the previous rank's.
uint64_t gloo_ring_bytes_sent(int rank, int size, size_t total, size_t elem) {
  const size_t p = static_cast<size_t>(size);
  const size_t max_segment =
      elem * std::max<size_t>(1, gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize / elem);
  auto round_up = [](size_t x, size_t m) { return (x + m - 1) / m * m; };
  const size_t segments =
      round_up(std::max((total + max_segment - 1) / max_segment, 2 * p), p);
  const size_t segment_bytes = round_up((total + segments - 1) / segments, elem);
  const size_t chunk_bytes = segment_bytes * (segments / p);
  auto chunk = [&](size_t c) {
    const size_t begin = c * chunk_bytes;
    return begin >= total ? size_t{0} : std::min(chunk_bytes, total - begin);
  };
  const size_t r = static_cast<size_t>(rank);
  return 2 * static_cast<uint64_t>(total) - chunk(r) - chunk((r + p - 1) % p);
}

void GlooComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  // Argument errors first: they leave the communicator usable.
  const ReduceFn fn = reduce_function(dtype, op);
  CC_CHECK(buf != nullptr || count == 0, kInvalidArgument, who(),
           ": allreduce of ", count, " elements from a null buffer");
  const size_t elem = dtype_size(dtype);
  CC_CHECK(count <= std::numeric_limits<size_t>::max() / elem, kInvalidArgument,
           who(), ": allreduce count ", count, " overflows the byte size");

  CallScope call(*this, "allreduce");
  if (count == 0 || size_ == 1) return;

  // Gloo's ring sends to the next rank and receives from the previous one;
  // naming them lets a timeout point at the peers this rank was waiting on.
  const std::string what = detail::concat("gloo::allreduce (ring: sends to rank ",
                                          (rank_ + 1) % size_, ", receives from rank ",
                                          (rank_ + size_ - 1) % size_, ")");
  call.gloo_call(what, [&] {
    gloo::AllreduceOptions opts(context_);
    switch (elem) {
      case 1: set_output<uint8_t>(opts, buf, count); break;
      case 2: set_output<uint16_t>(opts, buf, count); break;
      case 4: set_output<uint32_t>(opts, buf, count); break;
      case 8: set_output<uint64_t>(opts, buf, count); break;
      default:
        CC_THROW(kInternal, "allreduce: unexpected element size ", elem,
                 " for dtype ", dtype_name(dtype));
    }
    opts.setReduceFunction(fn);
    opts.setTag(call.tag());
    opts.setTimeout(call.remaining());
    gloo::allreduce(opts);
  });
  note_sent(gloo_ring_bytes_sent(rank_, size_, count * elem, elem));
}

}  // namespace compcoll
