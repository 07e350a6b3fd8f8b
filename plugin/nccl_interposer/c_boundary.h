// The C boundary of the interposer: no exception crosses it.
//
// Every exported nccl* function runs its body through guard(), which turns a
// compcoll::Error (or anything else thrown) into an ncclResult_t, logs it at
// WARN, and keeps its message as this thread's last error, which our
// ncclGetLastError returns (NCCL's own last error is per thread too, and
// like NCCL's it stays until a newer error replaces it). When a forwarded
// call fails inside the real NCCL, ours is cleared so that the real
// ncclGetLastError, which then has the newer message, answers again.
#pragma once

#include <nccl.h>

#include <exception>
#include <string>

#include "compcoll/error.h"

namespace compcoll::interposer {

// kTransport -> ncclRemoteError (a peer died or stalled: what NCCL reports
// for a remote failure), kInvalidArgument -> ncclInvalidArgument,
// kMismatch/kUnsupported -> ncclInvalidUsage, kMalformedPayload ->
// ncclRemoteError, kInternal -> ncclInternalError.
ncclResult_t to_nccl_result(ErrorKind kind);

// This thread's last error from the interposer ("" when none).
const std::string& last_error();
void clear_last_error();
// Records msg as the last error, logs it at WARN, returns r.
ncclResult_t fail_with(ncclResult_t r, const std::string& where, const std::string& msg);

template <typename Fn>
ncclResult_t guard(const char* where, Fn&& fn) noexcept {
  try {
    const ncclResult_t r = fn();
    if (r != ncclSuccess && r != ncclInProgress) clear_last_error();  // NCCL's own failure
    return r;
  } catch (const Error& e) {
    return fail_with(to_nccl_result(e.kind()), where, e.what());
  } catch (const std::bad_alloc&) {
    return fail_with(ncclSystemError, where, "out of host memory");
  } catch (const std::exception& e) {
    return fail_with(ncclInternalError, where, e.what());
  } catch (...) {
    return fail_with(ncclInternalError, where, "unknown exception");
  }
}

}  // namespace compcoll::interposer
