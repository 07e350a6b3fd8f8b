// Which "host" this process is on, for the host hierarchy: the ranks that can
// share POSIX shared memory AND one network interface. Network namespaces on
// one machine share the hostname and /dev/shm, so neither the hostname nor
// /dev/shm alone tells hosts apart; what does is the kernel (its boot id)
// together with the network namespace (the inode of /proc/self/ns/net) and
// the filesystem at /dev/shm (its device: containers that share the host's
// network still mount /dev/shm each for themselves).
#pragma once

#include <string>

namespace compcoll {

// "<boot id>/net:<inode>/shm:<device>". Throws Error(kUnsupported) naming the file when
// /proc cannot be read (then set COMPCOLL_HOST_ID, or COMPCOLL_HIERARCHY=off).
std::string detect_host_id();

// `override_id` when it is not empty (COMPCOLL_HOST_ID), else detect_host_id().
std::string host_id(const std::string& override_id);

// The id `rank` joins an exchange of host ids with (the hierarchy's layout,
// the NCCL interposer's COMPCOLL_NCCL_COMMS=multi-host test): host_id(override_id),
// or, where this rank cannot tell its host (no /proc), an id no other rank has.
// Such a rank counts as a host of its own, which is correct for every use, only
// without what sharing a host would save; `undetected` then says so and why,
// as a "; ..." suffix for the caller's log line, and is empty otherwise.
struct ExchangeHostId {
  std::string id;
  std::string undetected;
};
ExchangeHostId host_id_for_exchange(const std::string& override_id, int rank);

}  // namespace compcoll
