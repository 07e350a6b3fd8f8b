#include "plugin/nccl_interposer/comm_entry.h"

#include "collectives/lent_comm.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "collectives/dense.h"
#if defined(COMPCOLL_INTERPOSER_GPU_CODECS)
#include "collectives/cuda/gpu_sparse_allgather.h"
#endif
#include "compcoll/error.h"
#include "plugin/nccl_interposer/host_span.h"
#include "plugin/stats.h"

namespace compcoll::interposer {
namespace {

// At most this many distinct "forwarded because ..." lines per communicator:
// a program with ever-changing shapes must not grow memory through logging.
constexpr size_t kMaxLoggedShapes = 1024;

// The Communicator owns its Comm; the entry keeps the NcclComm so that it can
// still ask whether NCCL was aborted after the Communicator is gone (for
// example when creating it failed): it lends it through a LentComm.

}  // namespace

CommEntry::CommEntry(const Runtime& rt, ncclComm_t comm, int id, int parent, int origin_rank,
                     std::string lineage, int root_ordinal)
    : rt_(rt),
      comm_(comm),
      id_(id),
      parent_(parent),
      lineage_(std::move(lineage)),
      root_ordinal_(root_ordinal),
      lineage_decided_(parent >= 0),
      log_(rt.config->debug, -1) {
  snap_.id = id;
  snap_.parent = parent;
  snap_.origin_rank = origin_rank;
  refresh_identity();
}

CommEntry::~CommEntry() { finish(); }

void CommEntry::refresh_identity() {
  {
    std::lock_guard<std::mutex> lk(snap_mu_);
    if (snap_.rank >= 0) return;
  }
  if (aborted_) return;  // the handle is gone
  int rank = -1, size = -1;
  // A non-blocking communicator is not ready until its asynchronous state
  // leaves ncclInProgress; asked before, NCCL answers with an error and
  // prints a warning for every query. Asked again at the next call.
  ncclResult_t state = ncclSuccess;
  if (rt_.nccl->CommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress) return;
  if (rt_.nccl->CommUserRank(comm_, &rank) != ncclSuccess) return;
  if (rt_.nccl->CommCount(comm_, &size) != ncclSuccess) return;
  std::lock_guard<std::mutex> lk(snap_mu_);
  snap_.rank = rank;
  snap_.size = size;
  if (snap_.origin_rank < 0) snap_.origin_rank = rank;
  log_.set_rank(rank);
}

std::string CommEntry::lineage() {
  refresh_identity();
  std::lock_guard<std::mutex> lk(snap_mu_);
  if (!lineage_decided_ && snap_.rank >= 0) {
    if (rt_.launcher != nullptr) {
      lineage_ = root_state_tag(*rt_.launcher, snap_.rank, snap_.size, root_ordinal_);
    }
    lineage_decided_ = true;
  }
  return lineage_;
}

std::string CommEntry::next_child_lineage() {
  const std::string mine = lineage();
  return mine + (mine.empty() ? "" : ".") + "split" + std::to_string(children_++);
}

std::string CommEntry::state_tag() {
  std::string tag = lineage();
  if (parent_ >= 0) tag += "-origin" + std::to_string(origin_rank());
  return tag;
}

int CommEntry::origin_rank() {
  refresh_identity();
  std::lock_guard<std::mutex> lk(snap_mu_);
  return snap_.origin_rank;
}

bool CommEntry::aborted() const { return aborted_; }

void CommEntry::note_forwarded(size_t count, size_t elem_bytes, const char* dtype, const char* op,
                               const std::string& reason, bool gradient_like) {
  refresh_identity();
  std::lock_guard<std::mutex> lk(snap_mu_);
  CallRecord rec;
  rec.dense_bytes = ring_allreduce_bytes(count * elem_bytes, snap_.size > 0 ? snap_.size : 1);
  rec.wire_bytes = rec.dense_bytes;  // NCCL's own ring sends what a dense allreduce sends
  forwarded_.record(rec);
  if (gradient_like && snap_.rank == 0 && warned_reasons_.insert(reason).second) {
    // Not a silent no-op: what COMPCOLL_ALGO was set to compress is not.
    log_.warn("comm ", id_, ": ncclAllReduce ", count, " x ", dtype, " ", op,
              " forwarded to NCCL uncompressed, as will be every call like it: ", reason,
              " (compcoll compresses float32, float16 and bfloat16 SUM/AVG outside groups and "
              "graph capture; said once per reason; forwarded_calls in the stats counts them)");
  }
  if (log_.enabled(LogLevel::kInfo) && logged_.size() < kMaxLoggedShapes) {
    std::ostringstream shape;
    shape << count << " x " << dtype << " " << op << ": " << reason;
    if (logged_.insert(shape.str()).second) {
      log_.info("comm ", id_, ": ncclAllReduce ", shape.str(), " -> forwarded to NCCL");
    }
  }
  log_.trace("comm ", id_, ": forwarding ncclAllReduce of ", count, " x ", dtype, " ", op);
}

void CommEntry::ensure_transport(CUstream stream) {
  CC_CHECK(!aborted_, kTransport, "comm ", id_,
           ": this NCCL communicator was aborted after an earlier failure");
  if (!transport_) {
    nccl::NcclCommOptions o;
    o.timeout = rt_.config->timeout;
    o.stream = stream;
    o.stop = &stop_;
    transport_ = std::make_unique<nccl::NcclComm>(*rt_.nccl, *rt_.cuda, comm_, o);
  }
  transport_->set_stream(stream);
}

std::string CommEntry::scope_refusal(CUstream stream) {
  if (!rt_.config->nccl_multi_host_only) return {};
  std::lock_guard<std::mutex> lk(call_mu_);
  if (scope_refusal_) return *scope_refusal_;
  ensure_transport(stream);
  HostSpan span;
  try {
    span = exchange_host_span(*transport_, rt_.config->host_id);
  } catch (...) {
    aborted_ = transport_->aborted();
    throw;
  }
  const HostLayout& layout = span.layout;
  const std::string& undetected = span.undetected;
  if (span.several_hosts()) {
    scope_refusal_ = std::string();
    log_.info("comm ", id_, ": COMPCOLL_NCCL_COMMS=multi-host: its ranks span ",
              layout.describe(), "; its eligible allreduces are compressed", undetected);
  } else {
    scope_refusal_ = detail::concat(
        "COMPCOLL_NCCL_COMMS=multi-host and this communicator's ranks share one host (",
        layout.describe(), "): a tensor-parallel group within a node, say");
    log_.info("comm ", id_, ": ", *scope_refusal_, "; its allreduces go to NCCL uncompressed",
              undetected);
    left_out_ = true;
  }
  return *scope_refusal_;
}

void CommEntry::ensure_communicator(CUstream stream) {
  if (communicator_) return;
  ensure_transport(stream);
  // Stats are written by the interposer, per process and origin rank.
  Config cfg = *rt_.config;
  const int origin = origin_rank();
  // ... but checked at creation by the communicator, with the other ranks.
  if (!cfg.stats_file.empty() && origin >= 0) {
    cfg.owner_stats_path = stats_path(cfg.stats_file, origin);
  }
  cfg.stats_file.clear();
  cfg.state_tag = state_tag();
  try {
    // Collective: every rank makes the same first eligible call.
    communicator_ = std::make_unique<Communicator>(std::make_unique<LentComm>(*transport_), cfg);
  } catch (...) {
    aborted_ = transport_->aborted();
    throw;
  }
  if (rt_.loss_scaled != nullptr && rt_.loss_scaled->load()) {
    communicator_->set_discard_nonfinite(true);
  }
  make_device_route(cfg);
  log_.info("comm ", id_, (parent_ >= 0 ? " (split from comm " + std::to_string(parent_) + ")" : ""),
            ": compressing eligible allreduces with ", cfg.algo, " on ", transport_->who(),
            ", device ", transport_->device(), "; ",
            device_ ? "on the device with the GPU codecs where a call allows it"
                    : "staged through host memory: " + device_why_);
}

void CommEntry::make_device_route(const Config& cfg) {
  if (!cfg.device_codecs) {
    device_why_ = "COMPCOLL_DEVICE_CODECS=off";
    return;
  }
#if defined(COMPCOLL_INTERPOSER_GPU_CODECS)
  try {
    cuda::GpuRouteChoice choice = cuda::make_gpu_sparse_route(cfg.algo, cfg.params);
    device_ = std::move(choice.route);
    device_why_ = std::move(choice.why);
  } catch (const std::exception& e) {
    // The staged path still works: the GPU codecs' failure to start (device
    // memory for their scratch, say) is said, not fatal. Each rank decides
    // alone; staged and device calls exchange the same payloads.
    device_why_ = std::string("the GPU codecs could not start: ") + e.what();
  }
  if (device_ && rt_.cuda_runtime_started) rt_.cuda_runtime_started();
#else
  device_why_ = "this build has no GPU codecs (built without nvcc)";
#endif
  // Asked for and impossible: the setting changes nothing, which is said
  // once per process (calls a route refuses one by one are said at INFO).
  static std::atomic<bool> warned{false};
  if (!device_ && !warned.exchange(true)) {
    log_.warn("COMPCOLL_DEVICE_CODECS=on changes nothing here: ", device_why_,
              "; every compressed call is staged through host memory");
  }
}

std::string CommEntry::staging_reason(const void* send, const void* recv, size_t count,
                                      DType dtype, ReduceOp op) {
  if (!device_) return device_why_;
  return communicator_->device_route_refusal(*device_, send, recv, count, dtype, op);
}

void CommEntry::compressed_allreduce(const void* send, void* recv, size_t count, DType dtype,
                                     ReduceOp op, CUstream stream) {
  std::lock_guard<std::mutex> lk(call_mu_);
  ensure_communicator(stream);
  transport_->set_stream(stream);
  const size_t bytes = count * dtype_size(dtype);
  const std::string key = keys_.key(recv, count, dtype);
  try {
    const std::string staged = staging_reason(send, recv, count, dtype, op);
    if (staged.empty()) {
      // The GPU codecs wait on the stream without a deadline
      // (cudaStreamSynchronize): the caller's work ahead of this call, a
      // forwarded allreduce stuck on a dead peer say, is waited for first by
      // the transport's polled wait, which times out and aborts.
      transport_->drain("the caller's work ahead of a compressed call on the device");
      device_->set_stream(stream);
      communicator_->allreduce_device(*device_, send, recv, count, dtype, op, key.c_str());
    } else {
      if (log_.enabled(LogLevel::kInfo) && staged_reasons_.size() < kMaxLoggedShapes &&
          staged_reasons_.insert(staged).second) {
        log_.info("comm ", id_, ": ncclAllReduce ", count, " x ", dtype_name(dtype),
                  " staged through host memory: ", staged, " (said once per reason)");
      }
      host_.resize(bytes);
      transport_->download(host_.data(), send, bytes);
      communicator_->allreduce(host_.data(), count, dtype, op, key.c_str());
      transport_->upload(recv, host_.data(), bytes);
    }
  } catch (...) {
    aborted_ = transport_->aborted();
    publish();
    throw;
  }
  publish();
}

size_t CommEntry::rescale_state(float factor) {
  std::lock_guard<std::mutex> lk(call_mu_);
  // A failed communicator refuses it and reduces nothing any more: skipped.
  return communicator_ && !communicator_->broken() ? communicator_->rescale_state(factor) : 0;
}

void CommEntry::discard_nonfinite() {
  std::lock_guard<std::mutex> lk(call_mu_);
  if (communicator_ && !communicator_->broken()) communicator_->set_discard_nonfinite(true);
}

void CommEntry::publish() {
  std::lock_guard<std::mutex> lk(snap_mu_);
  if (!communicator_) return;
  // Calls the Communicator routed itself (none here: the interposer forwards
  // everything it does not compress) count as its calls.
  snap_.counters = communicator_->stats().counters();
  snap_.state_entries = communicator_->state_entries();
  snap_.state_bytes = communicator_->state_bytes();
}

void CommEntry::finish() {
  std::lock_guard<std::mutex> lk(call_mu_);
  if (transport_ && transport_->aborted()) aborted_ = true;
  publish();
  communicator_.reset();  // its device-resident states first, then the route
  device_.reset();
  transport_.reset();
  std::lock_guard<std::mutex> slk(snap_mu_);
  snap_.destroyed = true;  // state_* keep their last values: what it held at the end
}

ncclResult_t CommEntry::abort_then_finish(const std::function<ncclResult_t()>& real_abort) {
  stop_.store(true, std::memory_order_release);
  std::unique_lock<std::mutex> lk(call_mu_, std::defer_lock);
  const auto deadline =
      std::chrono::steady_clock::now() + rt_.config->timeout + std::chrono::seconds(1);
  while (!lk.try_lock()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      log_.warn("comm ", id_, ": ncclCommAbort while a compressed call of another thread was "
                "still in flight after the timeout; aborting under it, its memory is left");
      return aborted_.exchange(true) ? ncclSuccess : real_abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A call stopped by stop_ aborted the communicator itself.
  if (transport_ && transport_->aborted()) aborted_ = true;
  const ncclResult_t r = aborted_.exchange(true) ? ncclSuccess : real_abort();
  publish();
  communicator_.reset();
  device_.reset();
  transport_.reset();
  std::lock_guard<std::mutex> slk(snap_mu_);
  snap_.destroyed = true;
  return r;
}

void CommEntry::finish_at_exit() {
  // Another thread may be inside a call when the program exits: wait for it
  // a little, never for ever (its peers may be gone).
  std::unique_lock<std::mutex> lk(call_mu_, std::defer_lock);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!lk.try_lock()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      log_.warn("comm ", id_, ": a call was still in flight at exit; its error-feedback state "
                "is not saved and its stats end at the last finished call");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (communicator_) communicator_->finish();
  publish();
}

CommSnapshot CommEntry::snapshot(bool refresh) {
  if (refresh) refresh_identity();
  std::lock_guard<std::mutex> lk(snap_mu_);
  CommSnapshot s = snap_;
  // snap_ holds the Communicator's totals; add the forwarded calls (no
  // warm-up, NCCL's own ring bytes: part of the steady state).
  s.forwarded_calls = forwarded_.calls();
  s.counters.add(forwarded_.counters());
  s.single_host = left_out_.load();
  return s;
}

}  // namespace compcoll::interposer
