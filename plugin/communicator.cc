#include "plugin/communicator.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "collectives/agreement.h"
#include "collectives/dense.h"
#include "collectives/dispatch.h"
#include "collectives/machine_load.h"
#include "collectives/momentum_handover.h"
#include "collectives/registry.h"
#include "collectives/sparse_allreduce.h"
#include "compcoll/error.h"
#include "compression/state_scale.h"
#include "plugin/state_file.h"
#include "transport/machine_cpus.h"
#include "transport/shm_group.h"
#include "transport/shm_host.h"

namespace compcoll {
namespace {

// Entries unused for this many calls are evicted: far more than the number
// of gradient buckets of any model, so only abandoned buffers go.
constexpr uint64_t kEvictAfterCalls = 10000;

}  // namespace

Communicator::Communicator(std::unique_ptr<Comm> comm, const Config& cfg)
    : cfg_(cfg),
      comm_(std::move(comm)),
      algo_(make_algorithm(cfg.algo, cfg.params)),
      states_(kEvictAfterCalls),
      log_(cfg.debug, comm_ ? comm_->rank() : -1, cfg.log_group) {
  CC_CHECK(comm_ != nullptr, kInvalidArgument, "a communicator needs a transport");
  // A misspelt COMPCOLL_* name is otherwise silently ignored (once per process).
  for (const std::string& w : unknown_variable_warnings_once()) log_.warn(w);
  if (cfg_.report_inert_settings) {
    for (const std::string& w : inert_setting_warnings_once(cfg_)) log_.warn(w);
  }
  warn_if_alone();
  const std::string description = cfg_.agreement_description();
  ensure_agreement(*comm_, description);
  check_stats_file();
  resolve_codec_threads();
  setup_hierarchy();
  try {
    if (hier_) {
      hier_->leader_phase([&](Comm& leaders) { algo_->attach(leaders); });
    } else {
      algo_->attach(*comm_);
    }
    log_.info("communicator of ", comm_->size(), " ranks, algo ", cfg_.algo, ", config hash ",
              std::hex, config_hash(description), std::dec, " (", description, ")");
    load_state_dir();
  } catch (const std::exception& e) {
    // A local peer whose creation got further names this cause at its
    // first call, not only "left the communicator".
    if (hier_) hier_->fail_now(e.what());
    throw;
  }
}

Communicator::~Communicator() {
  finish();
  release_state_claim();
}

void Communicator::warn_if_alone() const {
  // A lone rank's allreduce is the identity: a compressed call sends nothing
  // and only delays what it does not deliver. It still runs (a one-rank run
  // then trains as each rank of a many-rank one would, which is how a user
  // previews compression), but never without a word. auto stays exact here
  // (its cost model prices a lone rank's dense call at zero).
  static std::atomic<bool> said{false};
  if (comm_->size() != 1 || !cfg_.compression_enabled() || cfg_.algo == "auto") return;
  if (said.exchange(true)) return;
  log_.warn("world size 1: no allreduce crosses a link, so COMPCOLL_ALGO=", cfg_.algo,
            " saves nothing here and changes the results (what a call does not send waits in "
            "the residual, as on many ranks, so a one-rank run previews its effect on "
            "training); COMPCOLL_ALGO=auto keeps a lone rank exact (said once per process)");
}

void Communicator::resolve_codec_threads() {
  // dgc's encode, or auto's when it weighs dgc: the algorithm is agreed, and
  // every rank of a communicator stages alike, so all or none exchange.
  const bool reads = cfg_.algo == "dgc" || (cfg_.algo == "auto" && cfg_.params.auto_algo == "dgc");
  if (!reads || !cfg_.stages_device_tensors) {
    if (cfg_.params.codec_threads == kAutoCodecThreads) cfg_.params.codec_threads = 1;
    return;
  }
  // Collective even where this rank set a number: its peers may not have.
  const std::string mine = describe_machine_cpus();
  const MachineLoad machine = machine_of(exchange_machine_loads(*comm_, mine), mine);
  if (cfg_.params.codec_threads != kAutoCodecThreads) return;
  cfg_.params.codec_threads = staged_codec_threads(machine);
  log_.info("COMPCOLL_CODEC_THREADS=auto: ", cfg_.params.codec_threads,
            " threads for dgc's encode of staged device tensors (", machine.ranks,
            machine.ranks == 1 ? " rank on " : " ranks on ", machine.cpus,
            " CPUs on this machine; at most ", kMaxStagedCodecThreads, ")");
  if (cfg_.params.codec_threads != 1) algo_ = make_algorithm(cfg_.algo, cfg_.params);
}

// Collective: a stats file that cannot be written fails every rank now, not
// with a warning at the end of a long run.
void Communicator::check_stats_file() {
  const std::string path = cfg_.stats_file.empty() ? cfg_.owner_stats_path
                                                   : stats_path(cfg_.stats_file, comm_->rank());
  agree_step_succeeded(*comm_, kStatsFileCannotBeWritten,
                       path.empty() ? "" : stats_file_problem(path), ErrorKind::kInvalidArgument);
  // Every rank writing one file keeps only the last to finish: said, not
  // refused (a stats file is not worth failing a job for).
  static std::atomic<bool> said{false};
  const std::string shared = stats_file_shared_warning(cfg_.stats_file, comm_->size());
  if (!shared.empty() && comm_->rank() == 0 && !said.exchange(true)) log_.warn(shared);
  if (cfg_.stats_file.empty()) return;  // the owner writes the process's file
  if (stats_claim_.claim(path, comm_->rank()) != path) {
    log_.warn("COMPCOLL_STATS_FILE: another communicator of this process writes ", path,
              " for the same rank; this one writes ", stats_claim_.path(),
              ", so that neither overwrites the other");
  }
}

HierarchyChoice choose_hierarchy(Comm& world, const Config& cfg) {
  HierarchyChoice out;
  // Only compressed calls take the hierarchy; with compression off there is
  // nothing to set up (and no traffic for it).
  if (cfg.hierarchy == "off" || !cfg.compression_enabled()) return out;
  // A rank that cannot tell its host (no /proc) still joins the exchange,
  // as a host of its own: correct, only without the local step's saving.
  const auto [id, undetected] = host_id_for_exchange(cfg.host_id, world.rank());
  HostLayout layout = exchange_host_layout(world, id);
  const bool several_hosts = layout.hosts() > 1;
  const bool shared_host = layout.max_local_size() > 1;
  if (cfg.hierarchy == "auto" && !(several_hosts && shared_host)) {
    out.why = detail::concat("host hierarchy off (COMPCOLL_HIERARCHY=auto: ",
                             several_hosts ? "every host has one rank" : "all ranks share one host",
                             "; ", layout.describe(), ")", undetected);
    return out;
  }
  if (!shared_host) {
    // Set explicitly (host or shards) where no host has two ranks: every
    // rank would lead a host of one, which is the flat algorithm plus a
    // local step that moves nothing. Run flat, and say so (WARN, once per
    // process): the setting changes nothing here.
    out.warn = true;
    out.why = detail::concat("COMPCOLL_HIERARCHY=", cfg.hierarchy,
                             " changes nothing: every host has one rank (", layout.describe(),
                             "), so there is no local step; ", cfg.algo,
                             " runs between all ranks as without it", undetected);
    return out;
  }
  std::string cores;
  if (cfg.hierarchy == "auto") {
    // The leader compresses alone what its host's ranks would compress in
    // parallel, so the hierarchy pays only where they would contend for
    // cores anyway (docs/scaling.md, "When auto takes the hierarchy").
    const std::vector<MachineLoad> loads = exchange_machine_loads(world, describe_machine_cpus());
    const MachineLoad* busiest = &busiest_machine(loads);
    cores = detail::concat(busiest->ranks, " ranks on ", busiest->cpus,
                           busiest->cpus == 1 ? " CPU" : " CPUs", " on the busiest machine");
    if (!busiest->oversubscribed()) {
      out.why = detail::concat(
          "host hierarchy off (COMPCOLL_HIERARCHY=auto: every rank has a core of its own, ", cores,
          ", so the ranks compress in parallel faster than their leaders would alone; "
          "COMPCOLL_HIERARCHY=host forces it; ", layout.describe(), ")", undetected);
      return out;
    }
    cores = "; " + cores;
  }
  const int hosts = layout.hosts();
  const std::string described = layout.describe();
  std::unique_ptr<LocalGroup> local = connect_local_group(world, layout);
  out.hierarchy = std::make_unique<Hierarchy>(world, std::move(layout), std::move(local),
                                              cfg.hierarchy == "shards");
  const Hierarchy& h = *out.hierarchy;
  std::string role;
  if (h.slices() > 1) {
    role = h.is_leader()
               ? detail::concat("leads slice ", h.my_slice(), " of ", h.slices(),
                                " and keeps its error-feedback state; ", cfg.algo,
                                " runs between the ", hosts, " hosts' local rank ", h.my_slice())
               : detail::concat("owns no slice (its host has more ranks than the smallest, ",
                                h.slices(), ")");
  } else {
    role = detail::concat(
        h.is_leader() ? "leads its host and keeps the error-feedback state"
                      : "follows its host's leader",
        "; ", cfg.algo, " runs between ", hosts, hosts == 1 ? " leader" : " leaders");
  }
  std::string fallback;
  if (!h.sharded_fallback().empty()) {
    // shards asked for and not possible here: it runs as host would, so the
    // setting changes nothing beyond host (WARN, once per process).
    out.warn = true;
    fallback = detail::concat("; one leader per host, not slices: ", h.sharded_fallback(),
                              ", so COMPCOLL_HIERARCHY=shards runs as host would");
  }
  std::string alone;
  if (hosts == 1) {
    // Set explicitly with every rank on one host (auto stays off there): the
    // local reduce already sums the world, and the one leader then compresses
    // for no peer. It still runs (as a one-rank world does, it previews
    // compression's effect on training), but never without a word: it saves
    // nothing and changes the results, and the ratio it reports is traffic
    // that never existed (WARN, once per process).
    out.warn = true;
    alone = detail::concat("; every rank shares one host, so the local reduce is the whole "
                           "allreduce and the one leader's ", cfg.algo,
                           " crosses no link: it saves nothing and changes the results, and "
                           "its compression ratio counts traffic that is not sent "
                           "(COMPCOLL_HIERARCHY=auto keeps one host flat)");
  }
  out.why = detail::concat("host hierarchy on (COMPCOLL_HIERARCHY=", cfg.hierarchy, "): ",
                           described, "; this rank ", role, fallback, alone, cores, undetected);
  return out;
}

void Communicator::setup_hierarchy() {
  HierarchyChoice choice = choose_hierarchy(*comm_, cfg_);
  hier_ = std::move(choice.hierarchy);
  static std::atomic<bool> said_warning{false};
  if (choice.warn && !said_warning.exchange(true)) {
    log_.warn(choice.why, " (said once per process)");
  } else if (!choice.why.empty()) {
    log_.info(choice.why);
  }
}

void Communicator::finish() {
  if (finished_) return;
  finished_ = true;
  if (!cfg_.stats_file.empty()) {
    const std::string& path = stats_claim_.path();
    if (!write_file_atomically(path, stats_.json(comm_->rank(), comm_->size(), cfg_.algo,
                                                 state_bytes()))) {
      log_.warn("cannot write COMPCOLL_STATS_FILE ", path, " (", std::strerror(errno), ")");
    }
  }
  if (!state_path_.empty()) {
    if (!broken_.empty()) {
      // A failed call may have left a residual half-updated.
      log_.warn("COMPCOLL_STATE_DIR: not saving ", state_path_, ": this communicator failed");
    } else {
      std::error_code ec;
      std::filesystem::create_directories(cfg_.state_dir, ec);
      Bytes bytes;
      size_t saved = 0;
      std::string failed;
      try {
        bytes = save_state(&saved);  // copies device-resident states back, which can fail
      } catch (const std::exception& e) {
        failed = e.what();
      }
      if (!failed.empty()) {
        log_.warn("COMPCOLL_STATE_DIR: not saving ", state_path_, ": ", failed);
      } else if (write_binary_file_atomically(state_path_, bytes)) {
        log_.info("COMPCOLL_STATE_DIR: saved ", saved, " error-feedback states to ",
                  state_path_, " (", bytes.size(), " bytes)");
        // Older than this save: a later run of their size must not restore them.
        if (const std::string moved = other_world_sizes(true); !moved.empty()) {
          log_.info("COMPCOLL_STATE_DIR: moved ", moved, " (of another world size) to <file>.unused");
        }
      } else {
        log_.warn("COMPCOLL_STATE_DIR: cannot write ", state_path_, " (", std::strerror(errno),
                  "): this run's error-feedback state is lost");
      }
    }
    // Finished, it makes no more calls: a communicator created after it in
    // this process (the process group destroyed and created again, while
    // torch still holds this one) loads what it saved and saves its own.
    release_state_claim();
  }
  log_.info(stats_.summary(cfg_.algo), ", state ", state_bytes() / 1e6, " MB in ",
            states_.entries(), " tensors");
  warn_if_nothing_compressed();
}

namespace {
// Compressed calls of every communicator of the process: a group that
// compressed none while others did (tensor parallelism's group beside the
// data-parallel one) is not a job that got no compression.
std::atomic<uint64_t> compressed_calls_in_process{0};
}  // namespace

void Communicator::warn_if_nothing_compressed() const {
  // A short job can end before any tensor leaves the warm-up (csc and onebit
  // run it dense), or send only tensors too small to compress: the user asked
  // for compression and got none, which must not pass silently. Rank 0 says
  // it for all (the ranks agree on the configuration), once per process and
  // algorithm (a script's several groups end alike), and only at INFO when
  // another communicator of the process compressed (the job did get it).
  const uint64_t calls = stats_.calls();
  if (cfg_.algo == "dense" || calls == 0 || stats_.compressed_calls() != 0 ||
      comm_->rank() != 0) {
    return;
  }
  if (const uint64_t elsewhere = compressed_calls_in_process.load(); elsewhere != 0) {
    log_.info("COMPCOLL_ALGO=", cfg_.algo, " compressed none of this communicator's ", calls,
              " allreduce calls (other communicators of this process compressed ", elsewhere,
              "; COMPCOLL_DEBUG=INFO logs each tensor's route)");
    return;
  }
  static std::mutex said_mu;
  static std::set<std::string>* said = new std::set<std::string>;  // outlives exit hooks
  {
    std::lock_guard<std::mutex> lock(said_mu);
    if (!said->insert(cfg_.algo).second) return;
  }
  const uint64_t warmup = stats_.warmup_dense_calls();
  std::string why;
  const auto add = [&why](const std::string& part) { why += (why.empty() ? "" : "; ") + part; };
  if (warmup != 0) {
    add(detail::concat(warmup, " ran dense in the warm-up (COMPCOLL_WARMUP_STEPS=",
                       cfg_.params.warmup_steps, ": each tensor's first ",
                       cfg_.params.warmup_steps, " calls; set it lower for a job this short)"));
  }
  uint64_t by_caller = 0;
  for (const auto& [reason, n] : exact_by_caller_) {
    add(detail::concat(n, n == 1 ? " was" : " were", " sent exact by the front end (", reason, ")"));
    by_caller += n;
  }
  // The dense route's reasons that occurred, each with its count.
  for (const auto& [reason, n] : dense_by_reason_) {
    const auto by = exact_by_caller_.find(reason);
    const uint64_t policy = n - (by != exact_by_caller_.end() ? by->second : 0);
    if (policy == 0) continue;
    const bool min_elems = reason.find("COMPCOLL_MIN_ELEMS") != std::string::npos;
    add(detail::concat(policy, " took the dense route (", reason,
                       min_elems ? detail::concat("=", cfg_.min_elems) : std::string(), ")"));
  }
  if (const uint64_t chosen = calls - warmup - dense_route_calls_; chosen != 0) {
    add(detail::concat(chosen, " ran dense by ", cfg_.algo, "'s own choice"));
  }
  log_.warn("COMPCOLL_ALGO=", cfg_.algo, " compressed none of this communicator's ", calls,
            " allreduce calls: ", why, " (COMPCOLL_DEBUG=INFO logs each tensor's route)");
}

bool Communicator::drop_state(const std::string& key) {
  const bool dropped = states_.erase(StateKey{key, 0, 0, DType::kFloat32});
  if (dropped) log_.trace("dropped the error-feedback state of key:", key);
  return dropped;
}

void Communicator::merge_state(const std::string& from, const std::string& into) {
  const StateKey f{from, 0, 0, DType::kFloat32}, t{into, 0, 0, DType::kFloat32};
  switch (states_.merge(f, t)) {
    case StateStore::Merge::kNoSource: break;
    case StateStore::Merge::kMoved:
      log_.trace("moved the error-feedback state of key:", from, " to key:", into);
      break;
    case StateStore::Merge::kMerged:
      log_.trace("merged the error-feedback state of key:", from, " into key:", into);
      break;
    case StateStore::Merge::kSizeMismatch:
      log_.info("the error-feedback state of key:", from, " could not be merged into key:", into,
                " (another element count): its residual is dropped");
      break;
  }
}

void Communicator::allreduce(void* buf, size_t count, DType dtype, ReduceOp op, const char* key) {
  allreduce_on(choose_route(*algo_, count, dtype, op, cfg_.min_elems), buf, count, dtype, op, key);
}

void Communicator::allreduce_exact(void* buf, size_t count, DType dtype, ReduceOp op,
                                   const char* reason) {
  allreduce_on(Route{false, reason}, buf, count, dtype, op, nullptr);
  ++exact_by_caller_[reason];  // after the call, as run_call counts the dense routes
}

void Communicator::allreduce_on(const Route& route, void* buf, size_t count, DType dtype,
                                ReduceOp op, const char* key) {
  run_call(route, buf, count, dtype, op, key, true, [&](CodecState* state, bool hierarchical) {
    return hierarchical ? run_hierarchical(*hier_, *algo_, buf, count, dtype, op, state)
                        : run_allreduce(*comm_, *algo_, route, buf, count, dtype, op, state);
  });
}

std::string Communicator::device_route_refusal(const DeviceRoute& device, const void* send,
                                               const void* recv, size_t count, DType dtype,
                                               ReduceOp op) const {
  const Route route = choose_route(*algo_, count, dtype, op, cfg_.min_elems);
  if (!route.compressed) return route.reason;
  if (discard_nonfinite_) {
    // A skipped step must leave the state as it was; only the host route
    // keeps the copy that undoes it (run_call).
    return "a loss scaler is in charge (an overflowed step's error feedback is undone on the "
           "host route only)";
  }
  if (hier_ != nullptr) return "the host hierarchy (COMPCOLL_HIERARCHY) reduces in host memory";
  if (&algo_->unwrapped() != algo_.get()) {
    return "the momentum hand-over (COMPCOLL_MOMENTUM_HANDOVER) runs on the host";
  }
  const auto* sparse = dynamic_cast<const SparseAllreduce*>(algo_.get());
  if (sparse == nullptr) {
    return detail::concat(cfg_.algo, " has no GPU route (dgc, sdagc and sbc have)");
  }
  if (sparse->pattern_for(count, comm_->size()) != SparsePattern::kAllgather) {
    return "the scatter pattern (COMPCOLL_SPARSE_PATTERN) runs on the host";
  }
  return device.refuses(send, recv, count, dtype);
}

void Communicator::allreduce_device(DeviceRoute& device, const void* send, void* recv,
                                    size_t count, DType dtype, ReduceOp op, const char* key) {
  const std::string refused = device_route_refusal(device, send, recv, count, dtype, op);
  CC_CHECK(refused.empty(), kInternal, "allreduce_device of ", count, " x ", dtype_name(dtype),
           " that the device route refuses: ", refused);
  const Route route{true, "compressed on the device", /*device_buffers=*/true};
  run_call(route, recv, count, dtype, op, key, false, [&](CodecState* state, bool) {
    return device.allreduce(*comm_, send, recv, count, dtype, op == ReduceOp::kAvg, *state);
  });
}

namespace {

// A communicator's calls are collective and ordered: two of them running at
// once (two threads on one communicator) would interleave their messages, a
// hang or a wrong sum on some rank. The second is refused before it touches
// anything; the running one is unaffected.
class OneCallAtATime {
 public:
  // what: the refused call, as "an allreduce of 10 elements".
  OneCallAtATime(std::atomic<bool>& in_call, int rank, const std::string& what)
      : in_call_(in_call) {
    CC_CHECK(!in_call_.exchange(true), kInvalidArgument, "rank ", rank, ": ", what,
             " entered this communicator while another of its calls was running "
             "on another thread; a communicator's calls are collective and must come one at a "
             "time, in the same order on every rank (call it from one thread, or give each "
             "thread a communicator of its own)");
  }
  ~OneCallAtATime() { in_call_.store(false); }
  OneCallAtATime(const OneCallAtATime&) = delete;
  OneCallAtATime& operator=(const OneCallAtATime&) = delete;

 private:
  std::atomic<bool>& in_call_;
};

}  // namespace

void Communicator::check_not_broken() const {
  CC_CHECK(broken_.empty(), kTransport, "rank ", comm_->rank(),
           ": this communicator failed earlier and must be rebuilt; first error: ", broken_);
}

size_t Communicator::rescale_state(float factor) {
  const OneCallAtATime one_call(in_call_, comm_->rank(), "rescale_state");
  check_not_broken();
  CC_CHECK(std::isfinite(factor) && factor > 0.0f, kInvalidArgument,
           "the error-feedback state can only be rescaled by a finite factor > 0, got ", factor);
  return states_.rescale(factor);
}

void Communicator::set_discard_nonfinite(bool on) {
  const OneCallAtATime one_call(in_call_, comm_->rank(), "set_discard_nonfinite");
  check_not_broken();
  discard_nonfinite_ = on;
}

Communicator::StatsSnapshot Communicator::stats_snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

void Communicator::report_evicted(const StateStore::Evicted& evicted) {
  if (evicted.entries == 0) return;
  const std::string what = detail::concat(
      "dropped ", evicted.entries, " error-feedback state", evicted.entries == 1 ? "" : "s",
      " unused for ", kEvictAfterCalls, " compressed calls (calls on the dense route do not count)");
  if (evicted.holding == 0) {
    log_.info(what, ", none holding anything not sent yet");
    return;
  }
  std::string keys;
  for (const std::string& k : evicted.keys) keys += (keys.empty() ? "" : ", ") + k;
  if (evicted.holding > evicted.keys.size()) keys += ", ...";
  const std::string loss = detail::concat(
      evicted.holding, " of them held error feedback not sent yet (residual L1 norm ",
      evicted.residual_l1, "; ", keys, "), which is lost: a tensor reduced again under its key "
      "starts afresh");
  if (eviction_loss_said_) {
    log_.info(what, "; ", loss);
    return;
  }
  eviction_loss_said_ = true;
  log_.warn(what, "; ", loss, ". Keys that change between steps (buffers at new addresses under "
            "NULL keys) do this on every step: give each tensor a stable key. Later evictions "
            "are said at INFO");
}

void Communicator::refresh_stats_snapshot() {
  const size_t bytes = state_bytes();
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = StatsSnapshot{stats_.counters(), bytes};
}

void Communicator::run_call(const Route& route, void* buf, size_t count, DType dtype, ReduceOp op,
                            const char* key, bool algorithm_decides, const CallRunner& run) {
  const OneCallAtATime one_call(in_call_, comm_->rank(),
                                detail::concat("an allreduce of ", count, " elements"));
  // This call's, whatever becomes of it. Taken once this call holds the
  // communicator: a call refused above (another thread's, while one runs)
  // must not touch what the running one owns.
  const std::string order_key = std::exchange(handover_order_key_, std::string());
  check_not_broken();
  CC_CHECK(buf != nullptr || count == 0, kInvalidArgument, "allreduce of ", count,
           " elements from a null buffer");
  const auto t0 = std::chrono::steady_clock::now();
  StateKey skey{key ? key : "", reinterpret_cast<uintptr_t>(buf), count, dtype};
  const std::string skey_text = skey.str();
  CodecState* state = nullptr;
  const bool hierarchical = route.compressed && hier_ != nullptr;
  // Sharded, a rank keeps the state of its slice only.
  const size_t elems = hierarchical ? hier_->state_elems(count) : count;
  const size_t restored_dropped = states_.restored_dropped();
  // Under the hierarchy only leaders compress, so only they keep state, sized
  // for the leaders' communicator.
  if (route.compressed && (!hierarchical || hier_->is_leader())) {
    const CodecState* old = states_.find(skey);
    const size_t old_size = old != nullptr ? old->size() : 0;
    StateStore::Got got = StateStore::Got::kExisting;
    const int algo_world = hierarchical ? hier_->layout().hosts() : comm_->size();
    state = &states_.get(skey, elems, [&] { return algo_->make_state(elems, algo_world); }, &got);
    const char* what = elems == count ? "tensor " : "slice of the tensor ";
    switch (got) {
      case StateStore::Got::kExisting: break;
      case StateStore::Got::kNew:
        log_.trace("new error-feedback state for ", skey_text, " (", count, " elements)");
        break;
      case StateStore::Got::kReplaced:  // a reused key: another tensor at the address
        if (key != nullptr && *key != '\0' && cfg_.front_end == FrontEnd::kStandalone &&
            replaced_keys_said_.insert(key).second) {
          // A key the caller named, reused for another size: most likely a
          // slip, and the old residual (what was not yet sent) is dropped.
          log_.warn("error-feedback state of ", skey_text, " has ", old_size, " elements, this ",
                    "call's ", what, elems, ": its residual (what was not sent yet) is dropped and "
                    "a fresh state starts; give each tensor a key of its own (said once per key)");
        } else {
          log_.info("error-feedback state of ", skey_text, " has ", old_size,
                    " elements, this rank's ", what, elems, ": starting it fresh");
        }
        break;
      case StateStore::Got::kKeptAside:
        log_.info("checkpointed error-feedback state of ", skey_text, " has ", old_size,
                  " elements, this rank's ", what, elems,
                  ": starting this one fresh; the checkpointed state is kept aside for a call of "
                  "its size, as DDP's rebuilt bucket makes");
        break;
      case StateStore::Got::kBackFromAside:
        log_.info("checkpointed error-feedback state of ", skey_text, " (", elems,
                  " elements), kept aside by a call of another size, is back at its size");
        break;
    }
  }
  // The logged-decision maps only remember; bound them like the state store
  // (keys by address multiply when buffers move).
  if (routes_.size() > kEvictAfterCalls) routes_.clear();
  if (decisions_.size() > kEvictAfterCalls) decisions_.clear();
  auto& logged = routes_[skey_text];
  if (logged != route.reason) {
    logged = route.reason;
    log_.info(skey_text, " ", count, " x ", dtype_name(dtype), " ", reduce_op_name(op), ": ",
              route.compressed ? cfg_.algo : "dense", " (", route.reason, ")");
  }
  // The hand-over's mirror by call order (set_handover_order_key): in the
  // state for this call, back in its own entry after it, whatever happens;
  // the tensor's own mirror is not kept (the order's is the one used, and
  // stays the tensor's at its later calls without an order key).
  std::vector<float>* order_mirror = nullptr;
  const auto* handover = dynamic_cast<const MomentumHandover*>(algo_.get());
  if (state != nullptr && !route.device_buffers && handover != nullptr &&
      handover->hands_over()) {
    if (order_of_tensor_.size() > kEvictAfterCalls) order_of_tensor_.clear();  // bounded
    std::string key_of_mirror = order_key;
    if (!order_key.empty()) {
      order_of_tensor_[skey_text] = order_key;
    } else if (const auto it = order_of_tensor_.find(skey_text); it != order_of_tensor_.end()) {
      key_of_mirror = it->second;
    }
    if (!key_of_mirror.empty()) {
      order_mirror = &states_.order_mirror(key_of_mirror, elems, state->handed);
    }
  }
  struct MirrorIn {
    CodecState* state;
    std::vector<float>* mirror;
    MirrorIn(CodecState* s, std::vector<float>* m) : state(s), mirror(m) {
      if (mirror != nullptr) state->handed.swap(*mirror);
    }
    ~MirrorIn() {
      if (mirror == nullptr) return;
      state->handed.swap(*mirror);
      std::vector<float>().swap(state->handed);
    }
    MirrorIn(const MirrorIn&) = delete;
    MirrorIn& operator=(const MirrorIn&) = delete;
  } const mirror_in(state, order_mirror);
  // Before the call counts it: is this tensor still in its warm-up?
  const bool in_warmup =
      state != nullptr && state->step_count() < uint64_t(cfg_.params.warmup_steps);
  const uint64_t before = comm_->bytes_sent();
  // A device route ran this tensor before: a host call takes its state home
  // first (so that the copy below has it too).
  if (state != nullptr && !route.device_buffers) state->bring_to_host();
  // set_discard_nonfinite: what the state was, to go back to should the
  // result be one the caller skips.
  const bool undoable = discard_nonfinite_ && state != nullptr && !route.device_buffers &&
                        snapshot_codec_state(*state, undo_);
  CallInfo info;
  try {
    info = run(state, hierarchical);
  } catch (const TimeoutError& e) {
    broken_ = e.what();
    throw naming_timeout_setting(e, cfg_,
                                 "a dead or stuck peer fails any limit, a slow link only a short one");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) broken_ = e.what();
    throw;
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
  if (undoable && !all_finite(buf, count, dtype)) {
    restore_codec_state(*state, undo_);
    if (discarded_calls_++ == 0) {
      log_.info(skey_text, ": the result holds a non-finite value, so the loss scaler skips this "
                "step; its error-feedback state is left as it was before the call (and so for "
                "every later such call; COMPCOLL_DEBUG=TRACE logs each)");
    } else {
      log_.trace(skey_text, ": non-finite result, error-feedback state left as before the call");
    }
  }
  // Only a call that ran the algorithm has a decision of its own (a dense
  // route would read the previous call's).
  const std::string decision =
      route.compressed && algorithm_decides ? algo_->last_decision() : std::string();
  if (!decision.empty()) {
    auto& last = decisions_[skey_text];
    // Log when the choice changes, not when only the predicted times move.
    const std::string choice = decision.substr(0, decision.find(' '));
    if (last != choice) {
      last = choice;
      log_.info(cfg_.algo, ": ", skey_text, " ", count, " x ", dtype_name(dtype), ": ", decision);
    }
  }
  CallRecord rec;
  rec.compressed = route.compressed && decision.rfind("dense", 0) != 0;
  compressed_calls_in_process += rec.compressed;
  rec.warmup_dense = route.compressed && is_warmup_decision(decision);
  rec.in_warmup = in_warmup;
  dense_route_calls_ += !route.compressed;
  if (!route.compressed) ++dense_by_reason_[route.reason];
  rec.elements = count;
  rec.selected = info.selected;
  rec.dense_bytes = ring_allreduce_bytes(count * dtype_size(dtype), comm_->size());
  rec.wire_bytes = comm_->bytes_sent() - before;
  rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stats_.record(rec);
  report_evicted(states_.tick());
  // load_state told the caller the run resumed: a restored state dropped
  // unused means it did not, for some tensors. Said once, at WARN.
  if (states_.restored_dropped() > restored_dropped && !partial_resume_said_) {
    partial_resume_said_ = true;
    log_.warn("checkpointed error-feedback state dropped with no call of its key and size in ",
              kEvictAfterCalls, " compressed calls: the checkpoint was restored for tensors this run does not reduce (the "
              "model's tensors or DDP's buckets differ from the checkpointed run's), so the "
              "resume was partial (said once)");
  }
  refresh_stats_snapshot();
  log_.trace("allreduce ", skey_text, ": ", rec.wire_bytes, " B sent (dense ", rec.dense_bytes,
             " B), ", rec.ms, " ms");
}

}  // namespace compcoll
