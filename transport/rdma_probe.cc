#include "transport/rdma_probe.h"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>

#include "compcoll/error.h"

namespace compcoll {

namespace {

// The three libibverbs entry points we need, typed loosely: the device
// structs stay opaque.
using GetDeviceList = void** (*)(int*);
using FreeDeviceList = void (*)(void**);
using GetDeviceName = const char* (*)(void*);

}  // namespace

RdmaProbe probe_rdma() {
  RdmaProbe probe;
  std::error_code ec;
  probe.sysfs_infiniband = std::filesystem::exists("/sys/class/infiniband", ec);

  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    probe.library_error = err != nullptr ? err : "unknown dlopen error";
    return probe;
  }
  probe.library_loaded = true;
  auto get_list = reinterpret_cast<GetDeviceList>(dlsym(lib, "ibv_get_device_list"));
  auto free_list = reinterpret_cast<FreeDeviceList>(dlsym(lib, "ibv_free_device_list"));
  auto get_name = reinterpret_cast<GetDeviceName>(dlsym(lib, "ibv_get_device_name"));
  if (get_list != nullptr) {
    int n = 0;
    void** list = get_list(&n);
    if (list != nullptr) {
      probe.device_count = n;
      for (int i = 0; i < n && get_name != nullptr; ++i) {
        const char* name = get_name(list[i]);
        probe.device_names.emplace_back(name != nullptr ? name : "?");
      }
      if (free_list != nullptr) free_list(list);
    }
  } else {
    probe.library_error = "libibverbs.so.1 has no ibv_get_device_list";
  }
  // No dlclose: libibverbs keeps provider state that does not survive being
  // unloaded, and libgloo links it anyway.
  return probe;
}

std::string describe_rdma(const RdmaProbe& probe) {
  if (!probe.library_loaded) {
    return detail::concat(
        "no RDMA user-space library could be loaded (dlopen libibverbs.so.1: ",
        probe.library_error, ")",
        probe.sysfs_infiniband ? "" : " and /sys/class/infiniband does not exist");
  }
  if (probe.device_count == 0) {
    return detail::concat(
        "no RDMA device was found on this machine (ibv_get_device_list "
        "returned 0 devices",
        probe.sysfs_infiniband ? "" : "; /sys/class/infiniband does not exist",
        ")");
  }
  std::string names;
  for (const auto& n : probe.device_names) names += (names.empty() ? "" : ", ") + n;
  return detail::concat("this machine has ", probe.device_count,
                        " RDMA device(s) (", names,
                        "), but Gloo cannot run compcoll's collectives on them");
}

}  // namespace compcoll
