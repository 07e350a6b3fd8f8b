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

}  // namespace compcoll
