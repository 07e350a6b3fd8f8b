#include "transport/shm_host.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "compcoll/error.h"

namespace compcoll {

std::string detect_host_id() {
  const char* boot_path = "/proc/sys/kernel/random/boot_id";
  std::ifstream f(boot_path);
  std::string boot;
  std::getline(f, boot);
  CC_CHECK(!boot.empty(), kUnsupported, "cannot read ", boot_path,
           " to tell hosts apart; set COMPCOLL_HOST_ID (equal on ranks that share a machine "
           "and a network namespace) or COMPCOLL_HIERARCHY=off");
  struct stat st {};
  CC_CHECK(stat("/proc/self/ns/net", &st) == 0, kUnsupported,
           "cannot stat /proc/self/ns/net to tell network namespaces apart (", std::strerror(errno),
           "); set COMPCOLL_HOST_ID or COMPCOLL_HIERARCHY=off");
  std::string id = boot + "/net:" + std::to_string(static_cast<unsigned long long>(st.st_ino));
  // Containers with the host's network (Kubernetes' hostNetwork, docker
  // --network host) share the boot id and the network namespace but each
  // mount a /dev/shm of their own, where the hierarchy's segments could not
  // meet: the filesystem mounted there tells them apart. (No /dev/shm: no
  // segment anywhere, so nothing to tell apart; the hierarchy says why.)
  struct stat shm {};
  if (stat("/dev/shm", &shm) == 0) {
    id += "/shm:" + std::to_string(static_cast<unsigned long long>(shm.st_dev));
  }
  return id;
}

std::string host_id(const std::string& override_id) {
  return override_id.empty() ? detect_host_id() : override_id;
}

ExchangeHostId host_id_for_exchange(const std::string& override_id, int rank) {
  ExchangeHostId out;
  try {
    out.id = host_id(override_id);
  } catch (const Error& e) {
    out.undetected = detail::concat("; rank ", rank, " counts as a host of its own: ", e.what());
    out.id = detail::concat("undetected:", rank, ":", std::random_device{}());
  }
  return out;
}

}  // namespace compcoll
