#include "transport/nccl/nccl_api.h"

#include <dlfcn.h>

#include "compcoll/error.h"

namespace compcoll::nccl {
namespace {

void* open_library(const std::string& path, const char* what) {
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    CC_THROW(kUnsupported, "cannot load ", what, " '", path, "': ", why ? why : "unknown dlopen error");
  }
  return h;
}

// dlsym(handle, name) into fn. Searching the handle (not RTLD_DEFAULT or
// RTLD_NEXT) finds the definition in that library or its dependencies, never
// a preloaded interposer's.
template <typename Fn>
void bind(void* handle, const std::string& path, const char* name, Fn& fn, bool required) {
  dlerror();
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  CC_CHECK(fn != nullptr || !required, kUnsupported, path, " does not export ", name,
           " (is it a real NCCL / CUDA driver library?)");
}

// Whether a and b lie in the same loaded object (dladdr's base address):
// comparing objects, not symbol addresses, is immune to symbol interposition.
bool same_object(const void* a, const void* b) {
  if (a == nullptr || b == nullptr) return false;
  Dl_info ia{}, ib{};
  if (dladdr(a, &ia) == 0 || dladdr(b, &ib) == 0) return a == b;
  return ia.dli_fbase == ib.dli_fbase;
}

// The file a loaded address lies in, for messages.
std::string object_file(const void* a) {
  Dl_info info{};
  if (a == nullptr || dladdr(a, &info) == 0 || info.dli_fname == nullptr) return "an unknown object";
  return info.dli_fname;
}

// The NCCL entry points compcoll does not intercept bind, in the
// application, to whatever NCCL the process loaded globally. If that is
// another library than the one loaded here (an application linked against
// one copy while COMPCOLL_NCCL_LIBRARY names another), a communicator made
// by one copy would be handed to the other, which fails with errors that
// name neither (ncclBroadcast: "invalid argument", seen on a GPU machine
// with a system NCCL beside torch's). Refuse that at load instead. Nothing
// to compare when no NCCL is global yet (a program that dlopens NCCL
// locally, or a Comm user that links none).
void check_same_nccl_as_the_application(const NcclApi& a) {
  const void* global = dlsym(RTLD_DEFAULT, "ncclBroadcast");
  if (global == nullptr || same_object(global, reinterpret_cast<const void*>(a.Broadcast))) return;
  const std::string loaded = object_file(reinterpret_cast<const void*>(a.Broadcast));
  CC_THROW(kUnsupported, "the NCCL library '", a.path, "'", loaded == a.path ? "" : " (" + loaded + ")",
           " is not the NCCL this process already uses (", object_file(global),
           "): two NCCL copies would mix their communicators; point COMPCOLL_NCCL_LIBRARY at ",
           object_file(global), " or leave it unset (libnccl.so.2 resolves to the loaded one)");
}

}  // namespace

std::string NcclApi::describe(ncclResult_t r, ncclComm_t comm) const {
  std::string s = GetErrorString ? GetErrorString(r) : "NCCL error";
  s += " (ncclResult_t " + std::to_string(int(r)) + ")";
  if (GetLastError != nullptr) {
    const char* last = GetLastError(comm);
    if (last != nullptr && *last != '\0') s += ": " + std::string(last);
  }
  return s;
}

NcclApi load_nccl(const std::string& path, const void* self) {
  NcclApi a;
  a.path = path;
  a.handle = open_library(path, "NCCL");
  try {
    bind(a.handle, path, "ncclAllReduce", a.AllReduce, true);
    CC_CHECK(!same_object(reinterpret_cast<const void*>(a.AllReduce), self), kUnsupported,
             "the NCCL library '", path, "' resolves to the compcoll interposer itself; point "
             "COMPCOLL_NCCL_LIBRARY at the real libnccl.so.2");
    bind(a.handle, path, "ncclAllGather", a.AllGather, true);
    bind(a.handle, path, "ncclBroadcast", a.Broadcast, true);
    bind(a.handle, path, "ncclSend", a.Send, true);
    bind(a.handle, path, "ncclRecv", a.Recv, true);
    bind(a.handle, path, "ncclGroupStart", a.GroupStart, true);
    bind(a.handle, path, "ncclGroupEnd", a.GroupEnd, true);
    bind(a.handle, path, "ncclCommCount", a.CommCount, true);
    bind(a.handle, path, "ncclCommUserRank", a.CommUserRank, true);
    bind(a.handle, path, "ncclCommCuDevice", a.CommCuDevice, true);
    bind(a.handle, path, "ncclCommGetAsyncError", a.CommGetAsyncError, true);
    bind(a.handle, path, "ncclCommAbort", a.CommAbort, true);
    bind(a.handle, path, "ncclGetErrorString", a.GetErrorString, true);
    bind(a.handle, path, "ncclCommInitRank", a.CommInitRank, true);
    bind(a.handle, path, "ncclCommInitAll", a.CommInitAll, true);
    bind(a.handle, path, "ncclCommDestroy", a.CommDestroy, true);
    bind(a.handle, path, "ncclReduceScatter", a.ReduceScatter, true);
    bind(a.handle, path, "ncclGetLastError", a.GetLastError, false);
    bind(a.handle, path, "ncclCommInitRankConfig", a.CommInitRankConfig, false);
    bind(a.handle, path, "ncclCommSplit", a.CommSplit, false);
    bind(a.handle, path, "ncclCommFinalize", a.CommFinalize, false);
    bind(a.handle, path, "ncclCommInitRankScalable", a.CommInitRankScalable, false);
    bind(a.handle, path, "ncclCommShrink", a.CommShrink, false);
    bind(a.handle, path, "ncclGroupSimulateEnd", a.GroupSimulateEnd, false);
    check_same_nccl_as_the_application(a);
  } catch (...) {
    dlclose(a.handle);
    throw;
  }
  return a;
}

std::string CudaDriverApi::describe(CUresult r) const {
  const char* msg = nullptr;
  if (GetErrorString == nullptr || GetErrorString(r, &msg) != CUDA_SUCCESS || msg == nullptr) {
    msg = "unknown CUDA error";
  }
  return std::string(msg) + " (CUresult " + std::to_string(int(r)) + ")";
}

CudaDriverApi load_cuda_driver(const std::string& path) {
  CudaDriverApi a;
  a.path = path;
  a.handle = open_library(path, "the CUDA driver");
  try {
    bind(a.handle, path, "cuInit", a.Init, true);
    bind(a.handle, path, "cuGetErrorString", a.GetErrorString, true);
    bind(a.handle, path, "cuCtxGetCurrent", a.CtxGetCurrent, true);
    bind(a.handle, path, "cuCtxGetDevice", a.CtxGetDevice, true);
    bind(a.handle, path, "cuCtxPushCurrent_v2", a.CtxPushCurrent, true);
    bind(a.handle, path, "cuCtxPopCurrent_v2", a.CtxPopCurrent, true);
    bind(a.handle, path, "cuDeviceGet", a.DeviceGet, true);
    bind(a.handle, path, "cuDevicePrimaryCtxRetain", a.DevicePrimaryCtxRetain, true);
    bind(a.handle, path, "cuMemAlloc_v2", a.MemAlloc, true);
    bind(a.handle, path, "cuMemFree_v2", a.MemFree, true);
    bind(a.handle, path, "cuMemcpyHtoDAsync_v2", a.MemcpyHtoDAsync, true);
    bind(a.handle, path, "cuMemcpyDtoHAsync_v2", a.MemcpyDtoHAsync, true);
    bind(a.handle, path, "cuStreamCreate", a.StreamCreate, true);
    bind(a.handle, path, "cuStreamDestroy_v2", a.StreamDestroy, true);
    bind(a.handle, path, "cuStreamQuery", a.StreamQuery, true);
    bind(a.handle, path, "cuStreamIsCapturing", a.StreamIsCapturing, true);
    const CUresult r = a.Init(0);
    CC_CHECK(r == CUDA_SUCCESS, kUnsupported, "cuInit failed in ", path, ": ", a.describe(r));
  } catch (...) {
    dlclose(a.handle);
    throw;
  }
  return a;
}

}  // namespace compcoll::nccl
