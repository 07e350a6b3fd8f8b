// A cheap look for RDMA devices, without linking libibverbs: the library is
// dlopen'ed when present and asked for its device list. Used to make the
// "ibverbs" transport's refusal say what this machine actually has.
#pragma once

#include <string>
#include <vector>

namespace compcoll {

struct RdmaProbe {
  bool library_loaded = false;  // libibverbs.so.1 could be dlopen'ed
  std::string library_error;    // dlerror() text when it could not
  int device_count = 0;         // what ibv_get_device_list reported
  std::vector<std::string> device_names;
  bool sysfs_infiniband = false;  // /sys/class/infiniband exists
};

RdmaProbe probe_rdma();

// One clause for messages, e.g. "no RDMA device was found on this machine
// (ibv_get_device_list returned 0 devices)".
std::string describe_rdma(const RdmaProbe& probe);

}  // namespace compcoll
