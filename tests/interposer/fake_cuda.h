// A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU,
// for tests only. "Device" memory is host memory; a stream is a FIFO of
// tasks that make progress whenever any stream is queried or synchronized
// (cuStreamQuery, cuStreamSynchronize), so work is asynchronous the way a
// GPU's is: enqueueing returns at once, completion is observed by polling.
// The stand-in NCCL (fake_nccl.cc) puts its collectives on these streams.
#pragma once

#include <cuda.h>

#include <functional>

namespace fakecuda {

// One unit of stream work. Called (under the engine's lock, so it must not
// call back into the driver) until it returns true; a task that returns
// false blocks the tasks behind it on its stream.
using Task = std::function<bool()>;

void enqueue(CUstream stream, Task task);

}  // namespace fakecuda
