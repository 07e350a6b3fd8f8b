// compcoll._C: the Python face of the torch backend. The backend object is
// handed to Python as a torch.distributed Backend (torch's own binding);
// compcoll-specific queries take it back and check that it is a compcoll one.
#include <algorithm>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "collectives/registry.h"
#include "integration/pytorch/csrc/backend.h"
#include "integration/pytorch/csrc/deferred_release.h"
#include "integration/pytorch/csrc/issue_scope.h"
#include "integration/pytorch/csrc/reference.h"
#include "integration/pytorch/csrc/torch_comm.h"
#include "plugin/config.h"
#include "plugin/logging.h"

namespace py = pybind11;
using compcoll::torch_integration::BufferSlots;
using compcoll::torch_integration::CompcollBackend;
using compcoll::torch_integration::DeferredRelease;
using compcoll::torch_integration::DeviceLaneSpec;
using compcoll::torch_integration::FailureBoard;
using compcoll::torch_integration::GroupTimeout;
using compcoll::torch_integration::Lane;
using compcoll::torch_integration::StatsIdentity;

namespace {

// How long exit waits for inner threads to let go of completed works before
// leaking the references it still shares (deferred_release.h). They let go
// within microseconds of completing; the bound is for a loaded machine.
constexpr std::chrono::milliseconds kExitReleaseBound{200};

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A Python callable that the backend keeps and calls from any thread: the
// final release takes the GIL (at interpreter teardown the reference is
// leaked instead: taking the GIL then is not safe).
std::shared_ptr<py::object> hold_callable(py::function fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    if (Py_IsInitialized() && !python_finalizing()) {
      py::gil_scoped_acquire gil;
      delete p;
    } else {
      p->release();
      delete p;
    }
  });
}

// Calls a held backend factory with the GIL; a Python error or a result that
// is not a backend becomes a C++ error (made while the GIL is held).
template <typename... Args>
c10::intrusive_ptr<c10d::Backend> call_factory(const py::object& fn, Args&&... args) {
  py::gil_scoped_acquire gil;
  try {
    return fn(std::forward<Args>(args)...).template cast<c10::intrusive_ptr<c10d::Backend>>();
  } catch (py::error_already_set& e) {
    throw std::runtime_error(e.what());
  } catch (const py::cast_error& e) {
    throw std::runtime_error(std::string("the factory did not return a c10d backend: ") +
                             e.what());
  }
}

// The device lane's factory: the inner backend for its tensors.
Lane::Factory backend_factory(py::function fn) {
  auto holder = hold_callable(std::move(fn));
  return [holder]() { return call_factory(*holder); };
}

// The child factory of split_group and merge_remote_group: the child backend.
compcoll::torch_integration::ChildFactory child_factory(py::function fn) {
  auto holder = hold_callable(std::move(fn));
  return [holder](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, const std::string& group_name) {
    return call_factory(*holder, store, rank, size, timeout, group_name);
  };
}

// b as compcoll's backend, or null. Not c10::dynamic_intrusive_pointer_cast:
// it releases its argument's reference and, when the cast fails, never gives
// it back, so asking whether torch's own Gloo backend is compcoll's
// (compcoll.state_dict on a group with compression off) leaked a reference:
// the backend outlived destroy_process_group and the process could abort at
// exit ("terminate called without an active exception").
c10::intrusive_ptr<CompcollBackend> compcoll_or_null(const c10::intrusive_ptr<c10d::Backend>& b) {
  auto* c = dynamic_cast<CompcollBackend*>(b.get());
  return c != nullptr ? c10::intrusive_ptr<CompcollBackend>::reclaim_copy(c)
                      : c10::intrusive_ptr<CompcollBackend>();
}

c10::intrusive_ptr<CompcollBackend> as_compcoll(const c10::intrusive_ptr<c10d::Backend>& b) {
  auto c = compcoll_or_null(b);
  TORCH_CHECK(c, "compcoll: backend ", b ? b->getBackendName() : "None",
              " is not a compcoll backend");
  return c;
}

// Test hook: every Comm call of a TorchComm over inner (staging device
// staging, or none), with rank-dependent payloads; tests/python checks the
// results and that staging changes nothing, byte counts included.
py::dict exercise_torch_comm(const c10::intrusive_ptr<c10d::Backend>& inner,
                             std::chrono::milliseconds timeout, std::optional<at::Device> staging) {
  using compcoll::Bytes;
  using compcoll::kUnboundedPart;
  std::vector<Bytes> gathered, empty_gathered, exchanged;
  std::vector<float> sums(5);
  std::vector<int64_t> isums(3);
  Bytes bcast(9, 0);
  uint64_t bytes = 0;
  {
    py::gil_scoped_release nogil;
    compcoll::torch_integration::TorchComm comm(
        inner, std::make_shared<compcoll::torch_integration::GroupTimeout>(timeout), staging);
    const int rank = comm.rank(), P = comm.size();
    const auto parts = [](const compcoll::Gathered& g) {
      std::vector<Bytes> out;
      for (int r = 0; r < g.parts(); ++r) out.emplace_back(g.part(r).begin(), g.part(r).end());
      return out;
    };
    const Bytes mine(3 * rank, static_cast<uint8_t>(rank));
    gathered = parts(comm.allgatherv(mine, kUnboundedPart));
    empty_gathered = parts(comm.allgatherv({}, kUnboundedPart));
    std::vector<Bytes> send(P);
    for (int j = 0; j < P; ++j) send[j].assign((rank + j) % 3, static_cast<uint8_t>(10 * rank + j));
    exchanged = comm.alltoallv(send, kUnboundedPart);
    std::fill(sums.begin(), sums.end(), float(rank + 1));
    comm.allreduce(sums.data(), sums.size(), compcoll::DType::kFloat32, compcoll::ReduceOp::kSum);
    std::fill(isums.begin(), isums.end(), int64_t(rank));
    comm.allreduce(isums.data(), isums.size(), compcoll::DType::kInt64, compcoll::ReduceOp::kSum);
    if (rank == P - 1) std::fill(bcast.begin(), bcast.end(), 7);
    comm.broadcast(bcast.data(), bcast.size(), P - 1);
    comm.barrier();
    bytes = comm.bytes_sent();
  }
  const auto lists = [](const std::vector<Bytes>& v) {
    py::list out;
    for (const Bytes& b : v) out.append(py::cast(std::vector<int>(b.begin(), b.end())));
    return out;
  };
  py::dict d;
  d["allgatherv"] = lists(gathered);
  d["empty_allgatherv"] = lists(empty_gathered);
  d["alltoallv"] = lists(exchanged);
  d["allreduce"] = sums;
  d["allreduce_int64"] = isums;
  d["broadcast"] = std::vector<int>(bcast.begin(), bcast.end());
  d["barrier"] = true;
  d["bytes_sent"] = bytes;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "compcoll: compressed allreduce as a torch.distributed backend";
  py::module_::import("torch.distributed");  // Backend and Work types

  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& inner, std::chrono::milliseconds timeout,
         std::optional<std::string> device_lane, std::optional<py::function> device_factory,
         int stats_rank, int stats_world_size, std::string state_tag,
         std::optional<py::function> child, std::string log_group, py::object store) {
        DeviceLaneSpec spec;
        if (device_lane) {
          TORCH_CHECK(device_factory, "compcoll: a device lane needs a device_factory");
          if (*device_lane == "cuda") {
            spec.type = c10::DeviceType::CUDA;
          } else if (*device_lane == "staged_cpu") {  // tests: the staged path on cpu tensors
            spec.type = c10::DeviceType::CPU;
          } else {
            TORCH_CHECK(false, "compcoll: unknown device lane '", *device_lane,
                        "' (cuda, staged_cpu)");
          }
          spec.name = *device_lane;
          spec.factory = backend_factory(std::move(*device_factory));
        }
        c10::intrusive_ptr<c10d::Store> group_store;
        if (!store.is_none()) group_store = store.cast<c10::intrusive_ptr<c10d::Store>>();
        compcoll::torch_integration::ChildFactory children;
        if (child) {
          children = child_factory(std::move(*child));
        }
        py::gil_scoped_release nogil;  // collective: other threads may need the GIL meanwhile
        auto backend = CompcollBackend::create(inner, timeout, std::move(spec),
                                               StatsIdentity{stats_rank, stats_world_size},
                                               std::move(state_tag), std::move(log_group),
                                               std::move(group_store));
        backend->set_child_factory(std::move(children));
        return c10::intrusive_ptr<c10d::Backend>(backend);
      },
      py::arg("inner"), py::arg("timeout"), py::arg("device_lane") = py::none(),
      py::arg("device_factory") = py::none(), py::arg("stats_rank") = -1,
      py::arg("stats_world_size") = -1, py::arg("state_tag") = "", py::arg("child") = py::none(),
      py::arg("log_group") = "", py::arg("store") = py::none(),
      "Wraps an inner (Gloo) backend; collective: every rank of the group calls it. "
      "device_lane ('cuda', or 'staged_cpu' for tests) with device_factory (a callable "
      "returning the inner backend for those tensors, called on their first operation) "
      "adds a host-staged lane for that device. stats_rank/stats_world_size: the process's "
      "global rank and world size, for COMPCOLL_STATS_FILE (default: the group's). state_tag: "
      "names the group's COMPCOLL_STATE_DIR files ('' for the default group). child: "
      "child(store, rank, size, timeout, group_name) -> the backend of a group split or merged "
      "from this one (split_group, merge_remote_group); without it the group cannot do either. "
      "log_group: the group its log lines name beside their rank ('' for the default group). "
      "store: the group's store, for the failure board that names the ranks gone or stuck when "
      "an operation fails (none: errors name no peer).");

  // The failure board a backend keeps on its group's store, on its own: for
  // the tests, which drive it over real stores (a stale board, a store whose
  // host is gone or stopped) without making a group fail.
  py::class_<FailureBoard, std::shared_ptr<FailureBoard>>(
      m, "_FailureBoard", "A group's failure board (failure_board.h); for tests.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             py::gil_scoped_release nogil;
             return std::make_shared<FailureBoard>(store, rank, size,
                                                   std::make_shared<GroupTimeout>(timeout));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      .def("report",
           [](FailureBoard& board, const std::string& failure, bool followed,
              std::chrono::milliseconds timeout) {
             py::gil_scoped_release nogil;
             return board.report(failure, followed, timeout);
           },
           py::arg("failure"), py::arg("followed") = false,
           py::arg("timeout") = std::chrono::milliseconds(0))
      .def("check_peers",
           [](FailureBoard& board) -> py::object {
             std::optional<FailureBoard::Post> post;
             {
               py::gil_scoped_release nogil;
               post = board.check_peers();
             }
             if (!post) return py::none();
             return py::make_tuple(post->rank, post->followed, post->text);
           })
      .def("listen_for", &FailureBoard::listen_for, py::arg("timeout"))
      .def_property_readonly("check_every", &FailureBoard::check_every);

  m.def("is_compcoll", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    return static_cast<bool>(compcoll_or_null(b));
  });
  m.def(
      "finish", [](const c10::intrusive_ptr<c10d::Backend>& b) { as_compcoll(b)->finish(); },
      py::call_guard<py::gil_scoped_release>(),
      "Drains the backend's queue and writes COMPCOLL_STATS_FILE (idempotent).");
  m.def("_note_optimizer_step", &compcoll::torch_integration::note_optimizer_step,
        "An optimizer step begins (compcoll/_momentum.py's pre-hook): the boundary the "
        "momentum hand-over's mirrors of reallocated tensors are counted from (lane.h).");
  m.def(
      "finish_all",
      [] {
        for (auto& b : CompcollBackend::live()) {
          b->close_failure_board();  // exiting: nobody listens, the store may be gone
          try {
            b->finish(CompcollBackend::FinishAt::kExit);
          } catch (const std::exception&) {
            // at exit: a failed backend has already reported its error
          }
        }
        // Before the interpreter finalizes (deferred_release.h).
        DeferredRelease::release_at_exit(kExitReleaseBound);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "momentum_agreement_pending",
      [] {
        for (auto& b : CompcollBackend::live()) {
          if (b->awaits_optimizer_momentum()) return true;
        }
        return false;
      },
      "Whether a live group awaits the agreement on the optimizer's momentum (it has compressed "
      "something and not agreed yet): the optimizer stepped now is the one it follows.");
  m.def(
      "configured_momentum",
      []() -> py::object {
        for (auto& b : CompcollBackend::live()) {
          if (const auto c = b->configured_momentum()) {
            return py::make_tuple(c->first, c->second);
          }
        }
        return py::none();
      },
      "(m, handed_over) of COMPCOLL_MOMENTUM where a live group has compressed something under "
      "it (handed_over: COMPCOLL_MOMENTUM_HANDOVER=1), else None.");
  m.def(
      "agree_optimizer_momentum",
      [](std::optional<float> proposal, bool moved, const std::string& why) {
        // Every live group that awaits it, in creation order (the same on
        // every rank: groups are created collectively).
        float moved_now = 0.0f;
        for (auto& b : CompcollBackend::live()) {
          if (b->awaits_optimizer_momentum()) {
            std::optional<compcoll::OptimizerMomentum> mine;
            if (proposal) mine = compcoll::OptimizerMomentum{*proposal, moved};
            b->agree_optimizer_momentum(mine, why);
          } else {
            b->check_one_allreduce_per_step(proposal.has_value());
          }
          // A destroyed group reduces nothing any more: its momentum is not
          // applied (the optimizer gets its beta1 back).
          const compcoll::OptimizerMomentum taken = b->optimizer_momentum();
          if (taken.moved && !b->finished()) moved_now = std::max(moved_now, taken.m);
        }
        return moved_now;
      },
      py::arg("proposal"), py::arg("moved"), py::arg("why"),
      py::call_guard<py::gil_scoped_release>(),
      "COMPCOLL_MOMENTUM_HANDOVER=auto, at every optimizer step: every live group still awaiting "
      "it agrees on the optimizer's momentum (moved: Adam's beta1), and checks one allreduce per "
      "gradient and step over the step after (collective per group, once each; see "
      "compcoll/_momentum.py). proposal None: a step this rank shadows under DDP's Join, with "
      "no optimizer stepping (it abstains). Returns the momentum some group has moved out of "
      "the optimizer and still applies (0: none): the optimizer must then run with beta1 = 0.");
  m.def(
      "stats_json", [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->stats_json(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "state_entries",
      [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->state_entries(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "save_state",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        std::map<std::string, compcoll::Bytes> lanes;
        {
          py::gil_scoped_release release;
          lanes = as_compcoll(b)->save_state();
        }
        py::dict d;
        for (const auto& [name, bytes] : lanes) {
          d[py::str(name)] = py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        }
        return d;
      },
      "Each lane's error-feedback checkpoint: {lane name: bytes}.");
  m.def(
      "load_state",
      [](const c10::intrusive_ptr<c10d::Backend>& b, const py::dict& lanes) {
        std::map<std::string, compcoll::Bytes> in;
        for (const auto& [name, value] : lanes) {
          const std::string bytes = py::cast<py::bytes>(value);
          in[py::cast<std::string>(name)] = compcoll::Bytes(bytes.begin(), bytes.end());
        }
        py::gil_scoped_release release;
        return as_compcoll(b)->load_state(in);
      },
      "Restores {lane name: bytes}; returns {lane name: whether its state was used}.");
  m.def(
      "rescale_state",
      [](double factor) {
        size_t rescaled = 0;
        for (auto& b : CompcollBackend::live()) rescaled += b->rescale_state(factor);
        return rescaled;
      },
      py::call_guard<py::gil_scoped_release>(),
      "Rescales every error-feedback state of every live group of the process by factor (a "
      "loss-scale change, compcoll/_loss_scale.py); returns how many states.");
  m.def("_deferred_releases", &DeferredRelease::kept,
        "How many works wait to be let go on a caller's thread (deferred_release.h; tests).");
  m.def("note_loss_scaled", &CompcollBackend::note_loss_scaled,
        "A GradScaler scales this process's losses: a compressed call whose result is not "
        "finite leaves its error-feedback state as it was (the scaler skips that step).");
  m.def("algo", [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->config().algo; });
  m.def(
      "inner",
      [](const c10::intrusive_ptr<c10d::Backend>& b, const std::string& lane) {
        return as_compcoll(b)->inner_of(lane);  // None while it has not been built
      },
      py::arg("backend"), py::arg("lane") = "cpu");
  m.def(
      "device_lane",
      [](const c10::intrusive_ptr<c10d::Backend>& b) -> std::optional<std::string> {
        std::string name = as_compcoll(b)->device_lane();
        if (name.empty()) return std::nullopt;
        return name;
      },
      "The device lane's name ('cuda', 'staged_cpu'), or None.");
  m.def("mark_tensor_parallel",
        [](const c10::intrusive_ptr<c10d::Backend>& b) { as_compcoll(b)->mark_tensor_parallel(); },
        "Every allreduce of this group takes the exact route (backend.h).");
  m.def("is_tensor_parallel",
        [](const c10::intrusive_ptr<c10d::Backend>& b) { return as_compcoll(b)->tensor_parallel(); });
  m.def("slots", [](const c10::intrusive_ptr<c10d::Backend>& b, const std::string& lane) {
    py::list out;
    for (const auto& s : as_compcoll(b)->slots(lane)) {
      py::dict d;
      d["key"] = s.key;
      d["numel"] = s.numel;
      d["dtype"] = s.dtype;
      d["live"] = s.live;
      d["replacements"] = s.replacements;
      d["uses"] = s.uses;
      d["overlapped"] = s.overlapped;
      d["chain"] = s.chain;
      d["retired"] = s.retired;
      d["owner"] = s.owner;
      out.append(d);
    }
    return out;
  }, py::arg("backend"), py::arg("lane") = "cpu");
  m.def("slot_shapes_tracked",
        [](const c10::intrusive_ptr<c10d::Backend>& b, const std::string& lane) {
          return as_compcoll(b)->slot_shapes_tracked(lane);
        },
        py::arg("backend"), py::arg("lane") = "cpu",
        "Shapes the lane's buffer slots keep counts for (buffer_slots.h): at most one per slot.");
  m.def("key_trace", [](const c10::intrusive_ptr<c10d::Backend>& b, const std::string& lane) {
    py::list out;
    for (const BufferSlots::TraceEntry& e : as_compcoll(b)->key_trace(lane)) {
      out.append(py::make_tuple(e.key, e.numel, compcoll::torch_integration::slot_event_name(e.event)));
    }
    return out;
  }, py::arg("backend"), py::arg("lane") = "cpu");
  m.def("_exercise_torch_comm", &exercise_torch_comm, py::arg("inner"), py::arg("timeout"),
        py::arg("staging") = py::none(), "Test hook: every Comm call through a TorchComm.");
  m.def("algorithm_names", [] { return compcoll::algorithm_names(); });
  m.def("config_variables", [] {
    py::list out;
    for (const auto& v : compcoll::config_table()) {
      out.append(py::make_tuple(v.name, v.default_value, v.allowed, v.doc));
    }
    return out;
  });
  m.def("settings_unread_while_off", [](const std::string& what_runs) {
    return compcoll::settings_unread_while_off_in_environment(what_runs);
  }, py::arg("what_runs"),
        "What compcoll says when it is off and other COMPCOLL_* variables are set ('' if none).");
  m.def("warn", [](int rank, const std::string& message) {
    compcoll::Logger(compcoll::LogLevel::kWarn, rank).warn(message);
  }, py::arg("rank"), py::arg("message"), "A WARN line in compcoll's format, on stderr.");
  m.def("_enter_gradient_scope", &compcoll::torch_integration::enter_gradient_scope,
        "compcoll.gradient_scope(): this thread's allreduces count as issued in backward.");
  m.def("_exit_gradient_scope", &compcoll::torch_integration::exit_gradient_scope,
        py::arg("saved"));
  m.def("_enter_values_scope", &compcoll::torch_integration::enter_values_scope,
        py::arg("kind") = 1,
        "Around SyncBatchNorm's backward (kind 1) or a checkpoint's recomputation (kind 2): "
        "this thread's allreduces are values (exact under every scope), even inside a backward "
        "pass; _exit_values_scope restores.");
  m.def("_exit_values_scope", &compcoll::torch_integration::exit_values_scope,
        py::arg("saved"));
  m.def("_enter_owner", &compcoll::torch_integration::enter_owner, py::arg("owner"),
        "Around a DDP comm hook: what this thread issues is for that hook's model.");
  m.def("_exit_owner", &compcoll::torch_integration::exit_owner, py::arg("saved"));
  m.def("validate_config",
        [] { compcoll::load_config(compcoll::env_read_by(compcoll::FrontEnd::kTorchBackend)); },
        "Parses the COMPCOLL_* environment; raises naming the first bad variable.");
  m.def("reference_allreduce", &compcoll::torch_integration::reference_allreduce,
        py::arg("config"), py::arg("inputs"), py::arg("average") = false,
        py::call_guard<py::gil_scoped_release>());
}
