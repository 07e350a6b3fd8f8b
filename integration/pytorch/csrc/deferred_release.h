// Works whose last reference must not be dropped by the inner backend's own
// threads.
//
// Why. A delegated operation's tensors are python_free aliases (no Python
// object of their own), but an alias shares the caller's storage, and a
// storage Python has seen (tensor.untyped_storage(), numpy(), frombuffer:
// all_gather_object does) has a Python object too. Whoever drops the last
// reference to that storage frees its Python object, under the GIL. When
// the caller lets go of its tensors before the operation is done, that
// last reference is the inner work's, and Gloo's thread drops it right
// after the work completes (ProcessGroupGloo::runLoop). Should the
// interpreter be finalizing by then, CPython ends that thread as it asks
// for the GIL; inside the work's destructor (noexcept) that aborts the
// process: "terminate called without an active exception" after the
// script's last line ran (seen: AsyncAllgatherWork after all_gather_object,
// about 1 exit in 400).
//
// What. Every work the backend issues to an inner backend is kept here as
// well, and the work the backend completes from an inner future's callback
// is handed here instead of being dropped on that thread. A kept work is
// let go only by a thread that calls into the backend (release_unshared,
// at every operation's entry and at finish) and only once this is its
// last reference; so the last reference always goes on a caller's thread
// (or with the Python objects that still hold the work). At interpreter
// exit (atexit, before finalization starts) release_at_exit lets go of
// what it can within a short bound and leaks the rest: a reference that is
// never dropped never frees anything, on any thread.
//
// Cost: a work's tensors stay allocated until the process's next operation
// on a compcoll group after the caller and the inner backend are done with
// them (not until the inner thread's drop), at most one operation longer.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstddef>

namespace compcoll::torch_integration {

class DeferredRelease {
 public:
  // Keeps a reference to work (null: nothing); any thread.
  static void keep(c10::intrusive_ptr<c10d::Work> work);
  // Drops the kept works nobody else holds any more. On a caller's thread,
  // outside every lock of the backend (a drop may take the GIL).
  static void release_unshared();
  // At interpreter exit, with the GIL released: release_unshared until
  // nothing is kept or `bound` has passed, then leaks what is still shared
  // (held by a Python object or by a thread that has not let go yet).
  // Returns how many were leaked.
  static size_t release_at_exit(std::chrono::milliseconds bound);
  // How many works are kept now (tests).
  static size_t kept();
};

}  // namespace compcoll::torch_integration
