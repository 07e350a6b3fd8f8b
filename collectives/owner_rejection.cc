#include "collectives/owner_rejection.h"

#include <cstring>

#include "compcoll/error.h"
#include "compression/payload.h"

namespace compcoll {
namespace {
constexpr uint64_t kRejected = ~uint64_t{0};
}  // namespace

Bytes rejection_marker(int sender) {
  Bytes out(kRejectionBytes);
  store_le<uint64_t>(out.data(), kRejected);
  store_le<uint32_t>(out.data() + 8, static_cast<uint32_t>(sender));
  return out;
}

std::optional<int> rejected_sender(std::span<const uint8_t> part) {
  if (part.size() != kRejectionBytes || load_le<uint64_t>(part.data()) != kRejected) return {};
  return static_cast<int>(load_le<uint32_t>(part.data() + 8));
}

void throw_owner_rejection(const char* name, const Comm& comm, int owner, int sender) {
  CC_THROW(kMalformedPayload, name, " allreduce on rank ", comm.rank(), ": rank ", owner,
           " refused the part rank ", sender, " sent it (rank ", owner, "'s error says why), "
           "so the call stops on every rank");
}

}  // namespace compcoll
