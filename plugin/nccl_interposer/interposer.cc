#include "plugin/nccl_interposer/interposer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <string_view>

#include "collectives/dispatch.h"
#include "collectives/momentum_handover.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "plugin/nccl_interposer/stats_report.h"
#include "plugin/state_file.h"
#include "plugin/stats.h"

namespace compcoll::interposer {
namespace {

thread_local int t_group_depth = 0;

// An address inside this library, for load_nccl's "is it ourselves" check.
void self_marker() {}

struct TypeInfo {
  bool known;   // has a compcoll DType
  DType dtype;
  const char* name;
  size_t bytes;
};

TypeInfo type_info(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return {true, DType::kInt8, "int8", 1};
    case ncclUint8: return {true, DType::kUInt8, "uint8", 1};
    case ncclInt32: return {true, DType::kInt32, "int32", 4};
    case ncclUint32: return {false, DType::kInt32, "uint32", 4};
    case ncclInt64: return {true, DType::kInt64, "int64", 8};
    case ncclUint64: return {false, DType::kInt64, "uint64", 8};
    case ncclFloat16: return {true, DType::kFloat16, "half", 2};
    case ncclFloat32: return {true, DType::kFloat32, "float", 4};
    case ncclFloat64: return {true, DType::kFloat64, "double", 8};
    case ncclBfloat16: return {true, DType::kBFloat16, "bfloat16", 2};
    default: return {false, DType::kUInt8, "fp8 or unknown", 1};  // fp8 types of NCCL >= 2.24
  }
}

// What a gradient may be (float64 included: said, not compressed).
bool is_floating(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

struct OpInfo {
  bool known;
  ReduceOp op;
  const char* name;
};

OpInfo op_info(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return {true, ReduceOp::kSum, "sum"};
    case ncclProd: return {true, ReduceOp::kProd, "prod"};
    case ncclMax: return {true, ReduceOp::kMax, "max"};
    case ncclMin: return {true, ReduceOp::kMin, "min"};
    case ncclAvg: return {true, ReduceOp::kAvg, "avg"};
    default: return {false, ReduceOp::kSum, "custom"};  // ncclRedOpCreatePreMulSum
  }
}

void at_exit() { Interposer::get().finish_at_exit(); }

std::optional<std::string> algo_in_environment() { return process_env()("COMPCOLL_ALGO"); }

// COMPCOLL_ALGO asks for compression (any value but unset, empty or dense,
// a bad one included: that is an error to report, not a pass-through).
bool compression_requested() {
  const std::optional<std::string> algo = algo_in_environment();
  return algo && !algo->empty() && *algo != "dense";
}

// COMPCOLL_ALGO as the environment has it, or "unset", for messages.
std::string algo_as_set() {
  const std::optional<std::string> algo = algo_in_environment();
  return algo && !algo->empty() ? *algo : "unset";
}

// What the interposer reads when compression is off: which NCCL and CUDA
// driver to load, and how much to say.
EnvLookup only_pass_through_settings(EnvLookup env) {
  return [env = std::move(env)](const char* name) -> std::optional<std::string> {
    const std::string_view n(name);
    if (n == "COMPCOLL_NCCL_LIBRARY" || n == "COMPCOLL_CUDA_LIBRARY" || n == "COMPCOLL_DEBUG") {
      return env(name);
    }
    return std::nullopt;
  };
}

// The CUDA runtime a device route started tears itself down at exit, in a
// handler registered when it started; handlers run last-registered first,
// so at_exit is registered again after it, to copy device-resident states
// back while the runtime still can. finish_at_exit runs once either way.
void at_exit_before_cuda_runtime() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Interposer::get().has_exit_work()) std::atexit(&at_exit);
  });
}

}  // namespace

Interposer& Interposer::get() {
  static Interposer* instance = new Interposer();  // never destroyed: see the header
  return *instance;
}

Interposer::Interposer() : log_(LogLevel::kWarn, -1) {
  launcher_ = launcher_identity();
  try {
    settings_ = load_settings();
    log_ = Logger(settings_.config.debug, -1);
  } catch (const std::exception& e) {
    config_error_ = e.what();
    if (!compression_requested()) {
      // Off: every call passes through, and a bad value of a setting that
      // would change nothing must not fail the program's NCCL. The settings
      // it still reads (which library to forward to) are loaded alone; the
      // rest are named below as changing nothing, the bad one among them.
      const std::string ignored = config_error_;
      config_error_.clear();
      try {
        settings_ = load_settings(only_pass_through_settings(process_env()));
        log_ = Logger(settings_.config.debug, -1);
        log_.info("NCCL interposer: ", ignored, "; ignored: COMPCOLL_ALGO is ", algo_as_set());
      } catch (const std::exception& e2) {
        config_error_ = e2.what();
      }
    }
    if (!config_error_.empty()) log_.warn("NCCL interposer: ", config_error_);
  }
  try {
    nccl_.emplace(nccl::load_nccl(settings_.nccl_library, reinterpret_cast<const void*>(&self_marker)));
  } catch (const std::exception& e) {
    nccl_error_ = e.what();
    log_.warn("NCCL interposer: ", nccl_error_);
  }
  if (!config_error_.empty() || !nccl_ || !settings_.config.compression_enabled()) {
    if (nccl_ && config_error_.empty()) {
      log_.info("NCCL interposer: COMPCOLL_ALGO is ", algo_as_set(),
                "; every call passes through to ", nccl_->path);
    }
    if (config_error_.empty() && !settings_.config.compression_enabled()) {
      // Preloaded, and given settings, but not COMPCOLL_ALGO: not a silent no-op.
      const std::string unread = settings_unread_while_off_in_environment(
          "the NCCL interposer passes every call through to NCCL unchanged",
          {"COMPCOLL_NCCL_LIBRARY", "COMPCOLL_DEBUG"});
      if (!unread.empty()) log_.warn("NCCL interposer: ", unread);
    }
    return;
  }
  try {
    // Refused rather than computing other math than the CPU path
    // (docs/convergence.md): the GPU codecs have no momentum handover, and
    // their masking below density 1 (compression/cuda, tests/gpu) has not run
    // on a device yet. The default
    // COMPCOLL_MOMENTUM_HANDOVER=auto needs the optimizer, which NCCL's
    // callers never show us: it stays off here, as documented.
    const AlgoParams& p = settings_.config.params;
    CC_CHECK(!p.momentum_handover && masking_density_or_always(p) == 1.0, kInvalidArgument,
             "COMPCOLL_MOMENTUM_HANDOVER=1 and COMPCOLL_MOMENTUM_MASKING_DENSITY below 1 are not "
             "implemented for GPU tensors (the NCCL interposer)");
    policy_ = make_algorithm(settings_.config.algo, settings_.config.params);
  } catch (const std::exception& e) {
    config_error_ = e.what();
    log_.warn("NCCL interposer: ", config_error_);
    return;
  }
  try {
    cuda_.emplace(nccl::load_cuda_driver(settings_.cuda_library));
  } catch (const std::exception& e) {
    cuda_error_ = e.what();
    log_.warn("NCCL interposer: ", cuda_error_, "; every allreduce is forwarded uncompressed");
  }
  enabled_ = true;
  // A program that exits without ncclCommDestroy still gets its stats and
  // its error-feedback checkpoint.
  if (has_exit_work()) std::atexit(&at_exit);
  log_.info("NCCL interposer: ", settings_.config.algo,
            " for float32/float16/bfloat16 SUM/AVG allreduces of at least ",
            settings_.config.min_elems, " elements outside groups and graph capture; everything "
            "else goes to ", nccl_->path);
}

// The stored messages already carry compcoll's prefix: throw them as they are.
const nccl::NcclApi& Interposer::real() const {
  if (!nccl_) throw Error(ErrorKind::kUnsupported, nccl_error_);
  return *nccl_;
}

void Interposer::check_config(int rank, int nranks) const {
  if (!config_error_.empty()) throw Error(ErrorKind::kInvalidArgument, config_error_);
  if (!enabled_ || rank < 0) return;
  // Now, before any traffic, not in a warning when the process exits.
  const Config& cfg = settings_.config;
  if (!cfg.stats_file.empty()) {
    // Worded as the communicator's collective check words one rank's part.
    const std::string problem = stats_file_problem(stats_path(cfg.stats_file, rank));
    CC_CHECK(problem.empty(), kInvalidArgument, kStatsFileCannotBeWritten, ": rank ", rank, ": ",
             problem);
    // Said, not refused, as the communicator says it (communicator.cc),
    // without a count: the first communicator a process creates with rank
    // 0 may be a subgroup's, and every process of the job writes the file.
    static std::atomic<bool> said{false};
    if (nranks > 1 && rank == 0 && cfg.stats_file.find("{rank}") == std::string::npos &&
        !said.exchange(true)) {
      log_.warn("COMPCOLL_STATS_FILE=", cfg.stats_file, " has no {rank}: every process of the "
                "job writes that one file and it keeps the last to finish; put {rank} in the "
                "name for a file per rank (said once per process)");
    }
  }
  if (!cfg.state_dir.empty()) {
    const std::string problem = state_dir_problem(cfg.state_dir);
    CC_CHECK(problem.empty(), kInvalidArgument, "COMPCOLL_STATE_DIR ", cfg.state_dir, ": ",
             problem);
  }
}

void Interposer::group_started() { ++t_group_depth; }
void Interposer::group_ended() {
  if (t_group_depth > 0) --t_group_depth;
}
int Interposer::group_depth() { return t_group_depth; }

std::shared_ptr<CommEntry> Interposer::add_entry(ncclComm_t comm, int parent_id, int origin_rank,
                                                 std::string lineage) {
  Runtime rt{&*nccl_, cuda_ ? &*cuda_ : nullptr, &settings_.config, &at_exit_before_cuda_runtime,
             &loss_scaled_, &launcher_};
  std::lock_guard<std::mutex> lk(mu_);
  const int id = next_id_++;
  const bool root = parent_id < 0;
  // A process's roots are one process's: named (stats file, checkpoint) by
  // the launcher's rank when there is one (launcher_identity.h).
  if (root && launcher_.known()) origin_rank = launcher_.rank;
  auto entry = std::make_shared<CommEntry>(rt, comm, id, parent_id, origin_rank, std::move(lineage),
                                           root ? roots_++ : -1);
  auto& slot = live_[comm];
  // A handle we still track was destroyed behind our back (an entry point we
  // do not wrap) and its address reused: the old entry's state is not this
  // communicator's.
  if (slot) finished_.push_back(slot->snapshot(/*refresh=*/false));
  slot = entry;
  log_.trace("comm ", id, parent_id >= 0 ? " split from comm " + std::to_string(parent_id) : " (root)",
             " registered");
  return entry;
}

void Interposer::register_root(ncclComm_t comm) {
  if (enabled_ && comm != nullptr) add_entry(comm, -1, -1);
}

void Interposer::register_child(ncclComm_t child, ncclComm_t parent) {
  if (!enabled_ || child == nullptr) return;
  const auto p = find_or_add(parent);
  add_entry(child, p->id(), p->origin_rank(), p->next_child_lineage());
}

std::shared_ptr<CommEntry> Interposer::find(ncclComm_t comm) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = live_.find(comm);
  return it == live_.end() ? nullptr : it->second;
}

std::shared_ptr<CommEntry> Interposer::find_or_add(ncclComm_t comm) {
  if (auto e = find(comm)) return e;
  return add_entry(comm, -1, -1);  // made by an entry point we do not wrap
}

std::vector<std::shared_ptr<CommEntry>> Interposer::live_entries() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<CommEntry>> out;
  for (const auto& [handle, e] : live_) out.push_back(e);
  return out;
}

size_t Interposer::loss_scale_changed(double factor) {
  CC_CHECK(std::isfinite(factor) && factor > 0.0, kInvalidArgument,
           "compcoll_nccl_loss_scale_changed: the loss-scale factor must be finite and > 0, got ",
           factor);
  if (!enabled_) return 0;  // COMPCOLL_ALGO unset or dense: nothing keeps state
  size_t rescaled = 0;
  // Entries are not held under mu_ while a call in flight finishes.
  for (const auto& e : live_entries()) rescaled += e->rescale_state(float(factor));
  if (loss_scale_changes_.fetch_add(1) == 0) {
    log_.info("the loss scale (torch.amp.GradScaler) changed by a factor of ", factor, ": ",
              rescaled, " error-feedback states hold scaled gradients and are rescaled with it "
              "(every later change does the same)");
  } else {
    log_.trace("loss scale x", factor, ", ", rescaled, " error-feedback states rescaled");
  }
  return rescaled;
}

void Interposer::note_loss_scaled() {
  if (!enabled_ || loss_scaled_.exchange(true)) return;
  for (const auto& e : live_entries()) e->discard_nonfinite();
  log_.info("a loss scaler (torch.amp.GradScaler) is in charge: a compressed call whose result "
            "is not finite (a step it skips) leaves its error-feedback state as it was");
}

bool Interposer::aborted_by_us(ncclComm_t comm) {
  if (!enabled_) return false;
  const auto e = find(comm);
  return e && e->aborted();
}

void Interposer::check_not_aborted_by_us(ncclComm_t comm, const char* call) {
  if (!enabled_) return;
  const auto e = find(comm);
  CC_CHECK(!e || !e->aborted(), kTransport, call, " on comm ", e ? e->id() : -1,
           ", which compcoll aborted after an earlier failure (the handle is gone); abort or "
           "destroy it and build a new one");
}

ncclResult_t Interposer::destroy(ncclComm_t comm, bool abort) {
  const nccl::NcclApi& nccl = real();
  std::shared_ptr<CommEntry> e;
  if (enabled_) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto it = live_.find(comm);
    if (it != live_.end()) {
      e = it->second;
      live_.erase(it);
    }
  }
  bool already_aborted = false;
  std::optional<ncclResult_t> aborted_now;
  if (e) {
    if (abort && !e->aborted()) {
      // The abort before the device memory is freed (CommEntry::abort_then_finish).
      aborted_now = e->abort_then_finish([&] { return nccl.CommAbort(comm); });
    } else {
      e->finish();
    }
    // Asked only now: a call of another thread that finish() waited for may
    // have aborted the communicator meanwhile, and the handle is then gone.
    already_aborted = !aborted_now && e->aborted();
    const CommSnapshot s = e->snapshot();
    {
      std::lock_guard<std::mutex> lk(mu_);
      finished_.push_back(s);
    }
    if (!settings_.config.stats_file.empty()) write_stats(s.origin_rank);
  }
  if (already_aborted) {
    log_.info("comm ", e->id(), ": already aborted by compcoll after a failure; nothing left to ",
              abort ? "abort" : "destroy");
    return ncclSuccess;
  }
  if (aborted_now) return *aborted_now;
  return abort ? nccl.CommAbort(comm) : nccl.CommDestroy(comm);
}

std::optional<std::string> Interposer::forward_reason(size_t count, ncclDataType_t dtype,
                                                      ncclRedOp_t op, cudaStream_t stream) const {
  if (t_group_depth > 0) return "inside ncclGroupStart/ncclGroupEnd";
  const TypeInfo t = type_info(dtype);
  if (!t.known) return std::string("dtype ") + t.name + " is not float32, float16 or bfloat16";
  const OpInfo o = op_info(op);
  if (!o.known) return "custom reduction op";
  const Route route = choose_route(*policy_, count, t.dtype, o.op, settings_.config.min_elems);
  if (!route.compressed) return route.reason;
  if (!cuda_) return "the CUDA driver is unavailable";
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = cuda_->StreamIsCapturing(reinterpret_cast<CUstream>(stream), &status);
  if (r != CUDA_SUCCESS) return "cannot query the stream's capture status: " + cuda_->describe(r);
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) return "the stream is being captured into a CUDA graph";
  return std::nullopt;
}

ncclResult_t Interposer::allreduce(const void* send, void* recv, size_t count,
                                   ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream) {
  const nccl::NcclApi& nccl = real();
  if (!enabled_) return nccl.AllReduce(send, recv, count, dtype, op, comm, stream);
  check_not_aborted_by_us(comm, "ncclAllReduce");
  const auto entry = find_or_add(comm);
  std::optional<std::string> why = forward_reason(count, dtype, op, stream);
  if (!why) {
    std::string refused = entry->scope_refusal(reinterpret_cast<CUstream>(stream));
    if (!refused.empty()) why = std::move(refused);
  }
  if (why) {
    const TypeInfo t = type_info(dtype);
    const OpInfo o = op_info(op);
    const bool floating = is_floating(dtype);
    // Not on a communicator COMPCOLL_NCCL_COMMS leaves to NCCL (decided at
    // this call or an earlier one): nothing of it would be compressed,
    // whatever its dtype or group.
    const bool gradient_like = !entry->left_out() && floating && o.known &&
                               (o.op == ReduceOp::kSum || o.op == ReduceOp::kAvg) &&
                               count >= settings_.config.min_elems &&
                               cuda_.has_value();  // without the driver: said once at start
    entry->note_forwarded(count, t.bytes, t.name, o.name, *why, gradient_like);
    return nccl.AllReduce(send, recv, count, dtype, op, comm, stream);
  }
  entry->compressed_allreduce(send, recv, count, type_info(dtype).dtype, op_info(op).op,
                              reinterpret_cast<CUstream>(stream));
  return ncclSuccess;
}

ncclResult_t Interposer::reduce_scatter(const void* send, void* recv, size_t recvcount,
                                        ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  const nccl::NcclApi& nccl = real();
  if (enabled_) {
    check_not_aborted_by_us(comm, "ncclReduceScatter");
    const TypeInfo t = type_info(dtype);
    const OpInfo o = op_info(op);
    const bool gradient_like =
        is_floating(dtype) && o.known && (o.op == ReduceOp::kSum || o.op == ReduceOp::kAvg);
    int ranks = 1;
    if (gradient_like && nccl.CommCount(comm, &ranks) == ncclSuccess &&
        recvcount * static_cast<size_t>(std::max(ranks, 1)) >= settings_.config.min_elems &&
        !reduce_scatter_said_.exchange(true)) {
      log_.warn("ncclReduceScatter of ", recvcount, " x ", t.name, " ", o.name, " per rank goes to ",
                "NCCL uncompressed, as will every reduce-scatter: COMPCOLL_ALGO=",
                settings_.config.algo, " compresses ncclAllReduce only, and sharded training (FSDP, "
                "ZeRO-2/3) sums its gradients with reduce-scatters, so little or nothing of it is "
                "compressed (docs/gpu.md; said once per process)");
    }
  }
  return nccl.ReduceScatter(send, recv, recvcount, dtype, op, comm, stream);
}

void Interposer::write_stats(int origin_rank) {
  std::vector<std::shared_ptr<CommEntry>> live;
  std::vector<CommSnapshot> comms;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [handle, e] : live_) live.push_back(e);
    for (const auto& s : finished_) {
      if (s.origin_rank == origin_rank) comms.push_back(s);
    }
  }
  for (const auto& e : live) {
    CommSnapshot s = e->snapshot();
    if (s.origin_rank == origin_rank) comms.push_back(s);
  }
  std::sort(comms.begin(), comms.end(),
            [](const CommSnapshot& a, const CommSnapshot& b) { return a.id < b.id; });
  const std::string path = stats_path(settings_.config.stats_file, origin_rank);
  std::lock_guard<std::mutex> lk(stats_mu_);
  if (!write_file_atomically(path, stats_json(settings_.config.algo, origin_rank, comms))) {
    log_.warn("cannot write COMPCOLL_STATS_FILE ", path);
  }
}

bool Interposer::has_exit_work() const {
  return !settings_.config.stats_file.empty() || !settings_.config.state_dir.empty() ||
         settings_.config.nccl_multi_host_only;
}

void Interposer::warn_if_no_communicator_spans_hosts(const std::vector<CommSnapshot>& comms) {
  bool left_out = false, rank0 = false;
  uint64_t compressed = 0;
  for (const CommSnapshot& s : comms) {
    left_out |= s.single_host;
    rank0 |= s.origin_rank == 0;
    compressed += s.counters.compressed_calls;
  }
  // Once per job: by the process of world rank 0.
  if (!left_out || compressed > 0 || !rank0) return;
  log_.warn("COMPCOLL_NCCL_COMMS=multi-host: no allreduce of this process was compressed: every "
            "communicator that made an eligible allreduce has all its ranks on one host (a job "
            "on one node); COMPCOLL_NCCL_COMMS=all compresses them, where every large float "
            "allreduce is a gradient sum (docs/gpu.md)");
}

void Interposer::finish_at_exit() {
  if (!enabled_ || exited_.exchange(true)) return;
  std::set<int> origins;
  std::vector<std::shared_ptr<CommEntry>> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [handle, e] : live_) live.push_back(e);
    for (const auto& s : finished_) origins.insert(s.origin_rank);
  }
  for (const auto& e : live) e->finish_at_exit();
  if (settings_.config.nccl_multi_host_only) {
    std::vector<CommSnapshot> comms;
    {
      std::lock_guard<std::mutex> lk(mu_);
      comms = finished_;
    }
    for (const auto& e : live) comms.push_back(e->snapshot(/*refresh=*/false));
    warn_if_no_communicator_spans_hosts(comms);
  }
  if (settings_.config.stats_file.empty()) return;
  for (const auto& e : live) origins.insert(e->origin_rank());
  for (const int o : origins) write_stats(o);
}

}  // namespace compcoll::interposer
