// compcoll._C: the Python face of the torch backend. The backend object is
// handed to Python as a torch.distributed Backend (torch's own binding);
// compcoll-specific queries take it back and check that it is a compcoll one.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "collectives/registry.h"
#include "integration/pytorch/csrc/backend.h"
#include "integration/pytorch/csrc/reference.h"
#include "plugin/config.h"

namespace py = pybind11;
using compcoll::torch_integration::BufferSlots;
using compcoll::torch_integration::CompcollBackend;

namespace {

c10::intrusive_ptr<CompcollBackend> as_compcoll(const c10::intrusive_ptr<c10d::Backend>& b) {
  auto c = c10::dynamic_intrusive_pointer_cast<CompcollBackend>(b);
  TORCH_CHECK(c, "compcoll: backend ", b ? b->getBackendName() : "None",
              " is not a compcoll backend");
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "compcoll: compressed allreduce as a torch.distributed backend";
  py::module_::import("torch.distributed");  // Backend and Work types

  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& inner, std::chrono::milliseconds timeout) {
        return c10::intrusive_ptr<c10d::Backend>(CompcollBackend::create(inner, timeout));
      },
      py::arg("inner"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "Wraps an inner (Gloo) backend; collective: every rank of the group calls it.");

  m.def("is_compcoll", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    return static_cast<bool>(c10::dynamic_intrusive_pointer_cast<CompcollBackend>(b));
  });
  m.def(
      "finish", [](const c10::intrusive_ptr<c10d::Backend>& b) { as_compcoll(b)->finish(); },
      py::call_guard<py::gil_scoped_release>(),
      "Drains the backend's queue and writes COMPCOLL_STATS_FILE (idempotent).");
  m.def(
      "finish_all",
      [] {
        for (auto& b : CompcollBackend::live()) {
          try {
            b->finish();
          } catch (const std::exception&) {
            // at exit: a failed backend has already reported its error
          }
        }
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "stats_json", [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->stats_json(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "state_entries",
      [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->state_entries(); },
      py::call_guard<py::gil_scoped_release>());
  m.def("algo", [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->config().algo; });
  m.def("inner", [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->inner(); });
  m.def("slots", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    py::list out;
    for (const auto& s : as_compcoll(b)->slots()) {
      py::dict d;
      d["key"] = s.key;
      d["numel"] = s.numel;
      d["dtype"] = s.dtype;
      d["live"] = s.live;
      d["replacements"] = s.replacements;
      d["uses"] = s.uses;
      out.append(d);
    }
    return out;
  });
  m.def("key_trace", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    py::list out;
    for (const BufferSlots::TraceEntry& e : as_compcoll(b)->key_trace()) {
      out.append(py::make_tuple(e.key, e.numel, compcoll::torch_integration::slot_event_name(e.event)));
    }
    return out;
  });
  m.def("algorithm_names", [] { return compcoll::algorithm_names(); });
  m.def("config_variables", [] {
    py::list out;
    for (const auto& v : compcoll::config_table()) {
      out.append(py::make_tuple(v.name, v.default_value, v.allowed, v.doc));
    }
    return out;
  });
  m.def("validate_config", [] { compcoll::load_config(); },
        "Parses the COMPCOLL_* environment; raises naming the first bad variable.");
  m.def("reference_allreduce", &compcoll::torch_integration::reference_allreduce,
        py::arg("config"), py::arg("inputs"), py::arg("average") = false,
        py::call_guard<py::gil_scoped_release>());
}
