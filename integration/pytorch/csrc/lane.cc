#include "integration/pytorch/csrc/lane.h"

#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <stdexcept>

#include "compcoll/error.h"
#include "integration/pytorch/csrc/torch_comm.h"

namespace compcoll::torch_integration {

namespace {
// torch's default process-group timeout, for a lane whose group has not
// told it one yet.
constexpr std::chrono::milliseconds kDefaultBuildWait{30 * 60 * 1000};
}  // namespace

void without_gil(const std::function<void()>& fn) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    try {
      fn();
    } catch (...) {
      PyEval_RestoreThread(state);
      throw;
    }
    PyEval_RestoreThread(state);
  } else {
    fn();
  }
}

Lane::Lane(std::string name, c10::DeviceType type, c10::intrusive_ptr<c10d::Backend> inner)
    : name_(std::move(name)), type_(type), staged_(false), inner_(std::move(inner)) {
  CC_CHECK(inner_, kInvalidArgument, "lane ", name_, " needs an inner backend");
}

Lane::Lane(std::string name, c10::DeviceType type, Factory factory)
    : name_(std::move(name)), type_(type), staged_(true), factory_(std::move(factory)) {
  CC_CHECK(factory_ != nullptr, kInvalidArgument, "lane ", name_, " needs a backend factory");
}

Lane::~Lane() {
  comm_.reset();  // before the inner backend it talks through
}

c10::intrusive_ptr<c10d::Backend> Lane::built_inner() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inner_;
}

c10::intrusive_ptr<c10d::Backend> Lane::inner() {
  Factory factory;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Another thread may be building it: wait, bounded by the group's
    // timeout (torch's default when none was set yet), so a factory that
    // never returns becomes an error naming the lane.
    const auto limit = pending_timeout_.value_or(kDefaultBuildWait);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!inner_ && building_) {
      bool in_time = true;
      lock.unlock();
      without_gil([&] {
        std::unique_lock<std::mutex> l(mu_);
        in_time = built_cv_.wait_until(l, deadline, [&] { return inner_ || !building_; });
      });
      lock.lock();
      if (!in_time && !inner_ && building_) {
        CC_THROW_TIMEOUT(limit, "the inner backend for ", name_,
                         " tensors was still being built by another thread after ",
                         limit.count(), " ms (the group's timeout)");
      }
    }
    if (inner_) return inner_;
    building_ = true;
    factory = factory_;
  }
  c10::intrusive_ptr<c10d::Backend> built;
  try {
    // No lock held: the factory takes the GIL, and a thread holding the GIL
    // may be waiting for one of our locks.
    built = factory();
    CC_CHECK(built, kInternal, "the ", name_, " inner backend factory returned nothing");
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      building_ = false;
    }
    built_cv_.notify_all();
    CC_THROW(kTransport, "the inner backend for ", name_, " tensors could not be built: ",
             e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    inner_ = built;
    building_ = false;
    if (pending_timeout_) inner_->setTimeout(*pending_timeout_);
    if (pending_uid_) inner_->setGroupUid(*pending_uid_);
    if (pending_bound_) inner_->setBoundDeviceId(*pending_bound_);
    factory_ = nullptr;
  }
  built_cv_.notify_all();
  factory = nullptr;  // the last reference to the factory (it releases its Python callable)
  return built;
}

void Lane::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_timeout_ = timeout;
  if (inner_) inner_->setTimeout(timeout);
}

void Lane::set_group_uid(const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_uid_ = uid;
  if (inner_) inner_->setGroupUid(uid);
}

void Lane::set_bound_device(std::optional<at::Device> device) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_bound_ = device;
  if (inner_) inner_->setBoundDeviceId(device);
}

Communicator& Lane::ensure_comm(const Config& cfg,
                                const std::shared_ptr<const GroupTimeout>& timeout,
                                std::optional<c10::Device> staging) {
  if (comm_) return *comm_;
  CC_CHECK(comm_error_.empty(), kTransport, "the compcoll communicator for ", name_,
           " tensors could not be created earlier; the process group must be rebuilt (",
           comm_error_, ")");
  try {
    // A device lane keeps its own COMPCOLL_STATE_DIR file beside the host
    // lane's ("cpu" adds nothing to the group's tag).
    Config lane_cfg = cfg;
    if (name_ != "cpu") {
      lane_cfg.state_tag = cfg.state_tag.empty() ? name_ : cfg.state_tag + "-" + name_;
    }
    // A device lane stages its tensors through host memory, whose cores the
    // GPU job leaves idle (COMPCOLL_CODEC_THREADS=auto).
    lane_cfg.stages_device_tensors = staging.has_value();
    comm_ = std::make_unique<Communicator>(std::make_unique<TorchComm>(inner(), timeout, staging),
                                           lane_cfg);
    if (optimizer_momentum_.m > 0.0f) comm_->adopt_optimizer_momentum(optimizer_momentum_);
  } catch (const std::exception& e) {
    comm_error_ = e.what();
    throw;
  }
  return *comm_;
}

void Lane::adopt_optimizer_momentum(OptimizerMomentum taken) {
  optimizer_momentum_ = taken;
  if (comm_) comm_->adopt_optimizer_momentum(taken);
}

void Lane::count_direct(uint64_t bytes) {
  direct_calls_.fetch_add(1);
  direct_bytes_.fetch_add(bytes);
}

std::optional<c10::Stream> Lane::worker_stream(c10::Device d) {
  if (d.is_cpu()) return std::nullopt;
  auto it = streams_.find(d.index());
  if (it == streams_.end()) {
    const c10::impl::VirtualGuardImpl impl(d.type());
    it = streams_.emplace(d.index(), impl.getStreamFromGlobalPool(d, /*isHighPriority=*/false))
             .first;
  }
  return it->second;
}

at::Tensor stage_to_host(const at::Tensor& t) {
  auto options = at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU);
  if (!t.is_cpu()) options = options.pinned_memory(true);
  at::Tensor host = at::empty(t.sizes(), options);
  host.copy_(t);  // non_blocking=false: complete (the caller's stream synchronised) on return
  return host;
}

namespace {
std::atomic<uint64_t> g_optimizer_steps{0};
}  // namespace

void note_optimizer_step() { g_optimizer_steps.fetch_add(1); }
uint64_t optimizer_steps() { return g_optimizer_steps.load(); }

std::string Lane::handover_order_key(const at::Tensor& t, uint64_t pass, uint64_t owner,
                                     bool fresh) {
  if (pass == 0 || !fresh) return std::string();
  const uint64_t step = optimizer_steps();
  if (step != order_step_) {
    order_step_ = step;
    order_calls_.clear();
  }
  const int dtype = static_cast<int>(t.scalar_type());
  const uint64_t k = order_calls_[{owner, t.numel(), dtype}]++;
  return detail::concat("owner", owner, "/", t.numel(), "/", dtype, "/#", k);
}

}  // namespace compcoll::torch_integration
