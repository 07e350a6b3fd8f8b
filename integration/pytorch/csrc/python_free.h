// Tensors as the backend hands them to other threads: its worker's tasks,
// and the inner backend (Gloo's or NCCL's own threads).
//
// Why not the caller's tensors themselves: torch ties a tensor's Python
// object to its C++ references (c10/util/intrusive_ptr.h): a thread that
// drops a reference which leaves only the Python object's must decrement
// that object, under the GIL. Off the main thread that is a wait for the
// GIL, and once the interpreter has begun to finalize, CPython ends any
// other thread that asks for the GIL; inside a destructor (noexcept) that
// aborts the process: "terminate called without an active exception",
// after the script's last line ran (seen with ZeroRedundancyOptimizer,
// whose broadcast work Gloo's thread dropped while the interpreter was in
// its final garbage collection).
//
// A python_free alias is another TensorImpl over the same storage, offset,
// sizes and strides, with no Python object and no autograd history
// (Tensor::variable_data: a shallow copy made in C++, not an operator
// dispatched to a mode the caller may have active): what a collective
// writes through it is in the caller's tensor, and dropping it needs no GIL
// for the tensor itself. The storage is shared, though: the last reference
// to a storage Python has seen still frees that storage's Python object,
// and deferred_release.h keeps the inner backend's threads from being the
// ones to drop it. Only strided tensors are aliased: a sparse
// result is a new set of indices and values, which only the caller's own
// TensorImpl can receive, so those stay as they are.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace compcoll::torch_integration {

inline at::Tensor python_free(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided) return t;
  return t.variable_data();
}

inline std::vector<at::Tensor> python_free(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(python_free(t));
  return out;
}

inline std::vector<std::vector<at::Tensor>> python_free(
    const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& ts : lists) out.push_back(python_free(ts));
  return out;
}

}  // namespace compcoll::torch_integration
