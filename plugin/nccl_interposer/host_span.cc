#include "plugin/nccl_interposer/host_span.h"

#include <algorithm>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/agreement.h"
#include "compcoll/error.h"
#include "transport/shm_host.h"

namespace compcoll::interposer {

HostSpan exchange_host_span(Comm& comm, const std::string& host_id_override) {
  static constexpr std::string_view kTag = "compcoll:nccl_comms=multi-host:";
  HostSpan out;
  auto [id, undetected] = host_id_for_exchange(host_id_override, comm.rank());
  out.undetected = std::move(undetected);
  CC_CHECK(!id.empty() && id.size() <= kMaxHostIdBytes, kInvalidArgument,
           "COMPCOLL_HOST_ID must be 1 to ", kMaxHostIdBytes, " bytes");
  const std::string mine = std::string(kTag) + id;
  // Bounded by what any setup step sends, not by a host id: a rank at the
  // configuration agreement instead is then named below, not refused as
  // sending an oversized part.
  const Gathered parts = comm.allgatherv(
      std::span(reinterpret_cast<const uint8_t*>(mine.data()), mine.size()),
      std::max(kTag.size() + kMaxHostIdBytes, kMaxSetupPartBytes));
  std::vector<std::string> ids;
  for (int r = 0; r < parts.parts(); ++r) {
    const std::span<const uint8_t> bytes = parts.part(r);
    const std::string part(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    CC_CHECK(part.rfind(kTag, 0) == 0, kInvalidArgument, "rank ", r,
             " did not take part in COMPCOLL_NCCL_COMMS=multi-host's exchange of host ids: "
             "COMPCOLL_NCCL_COMMS must be the same on every rank");
    ids.push_back(part.substr(kTag.size()));
  }
  out.layout = HostLayout::from_ids(ids);
  return out;
}

}  // namespace compcoll::interposer
