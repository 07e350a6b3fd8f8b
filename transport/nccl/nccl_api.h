// Entry points of the real NCCL and of the CUDA driver, resolved at run time.
//
// Why tables and dlopen instead of linking: the NCCL interposer is preloaded
// in front of libnccl.so.2 and exports ncclAllReduce & co itself, so a direct
// call from inside it would call itself. The tables are filled by dlsym on a
// handle of the *real* library (dlopen of COMPCOLL_NCCL_LIBRARY), never by
// RTLD_DEFAULT or RTLD_NEXT (see docs/gpu.md for that choice). The CUDA side
// uses the driver API (libcuda.so.1): there is exactly one driver in a
// process, whatever CUDA runtime (or none) the application links, so device
// pointers, streams and contexts of the application are valid here. Loading
// both at run time also lets the CPU-only tests substitute stand-ins
// (tests/interposer) and lets this code build with headers only.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <string>

namespace compcoll::nccl {

// The real NCCL. Required entries are non-null after load_nccl(); optional
// ones (newer than NCCL 2.12 or interposer-only) may be null.
struct NcclApi {
  void* handle = nullptr;
  std::string path;  // what was dlopen'ed

  // Used by NcclComm (required).
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*CommCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommCuDevice)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;

  // What the interposer wraps and forwards (required: in every NCCL 2.x
  // the interposer supports).
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;

  // Optional.
  const char* (*GetLastError)(ncclComm_t) = nullptr;                       // 2.13
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int,
                                     ncclConfig_t*) = nullptr;             // 2.14
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;  // 2.18
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;                      // 2.14
  ncclResult_t (*CommInitRankScalable)(ncclComm_t*, int, int, int, ncclUniqueId*,
                                       ncclConfig_t*) = nullptr;           // 2.23
  ncclResult_t (*CommShrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) = nullptr;  // 2.27
  ncclResult_t (*GroupSimulateEnd)(ncclSimInfo_t*) = nullptr;              // 2.22

  // "ncclSystemError (message)" for logs and exceptions.
  std::string describe(ncclResult_t r, ncclComm_t comm = nullptr) const;
};

// dlopen(path, RTLD_NOW | RTLD_LOCAL) and dlsym of every entry. Throws
// compcoll::Error(kUnsupported) naming the path and dlerror() when the
// library or a required entry is missing, and when the library's
// ncclAllReduce lies in the same loaded object as `self` (any address inside
// the interposer: COMPCOLL_NCCL_LIBRARY pointing at the interposer itself).
NcclApi load_nccl(const std::string& path, const void* self = nullptr);

// The CUDA driver entries NcclComm and the interposer use (all required;
// the _v2 names are the ones cuda.h maps the plain names to).
struct CudaDriverApi {
  void* handle = nullptr;
  std::string path;

  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*StreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*StreamDestroy)(CUstream) = nullptr;
  CUresult (*StreamQuery)(CUstream) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;

  // "CUDA_ERROR_... (message)".
  std::string describe(CUresult r) const;
};

// dlopen + dlsym as load_nccl, then cuInit(0). Throws kUnsupported.
CudaDriverApi load_cuda_driver(const std::string& path);

}  // namespace compcoll::nccl
