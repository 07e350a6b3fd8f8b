// How the torch backend names and places an operation: the device its
// tensors are on, and the label its messages and the worker's timeout
// errors give it. Shared by the compressed path (backend.cc) and the
// delegated operations (delegated_ops.cc).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "compcoll/error.h"

namespace compcoll::torch_integration {

// The device of an operation: its first defined tensor's, else cpu.
template <typename... Lists>
inline c10::Device device_of(const Lists&... lists) {
  for (const std::vector<at::Tensor>* list : {&lists...}) {
    for (const at::Tensor& t : *list) {
      if (t.defined()) return t.device();
    }
  }
  return c10::Device(c10::kCPU);
}

inline std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> flat;
  for (const auto& v : lists) flat.insert(flat.end(), v.begin(), v.end());
  return flat;
}

// What a message calls an operation: its name, and the dtype, element count
// and device of its first tensor ("all_reduce (Float, 100 elements)").
inline std::string op_label(const char* title, const std::vector<at::Tensor>& tensors) {
  std::string name = title;
  if (name.rfind("compcoll:", 0) == 0) name = name.substr(9);
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    name += detail::concat(" (", c10::toString(t.scalar_type()), ", ", t.numel(), " elements",
                           t.is_cpu() ? std::string() : " on " + t.device().str(), ")");
    break;
  }
  return name;
}

}  // namespace compcoll::torch_integration
