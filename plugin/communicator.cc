#include "plugin/communicator.h"

#include <chrono>

#include "collectives/agreement.h"
#include "collectives/dense.h"
#include "collectives/dispatch.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
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
      log_(cfg.debug, comm_ ? comm_->rank() : -1) {
  CC_CHECK(comm_ != nullptr, kInvalidArgument, "a communicator needs a transport");
  // A misspelt COMPCOLL_* name is otherwise silently ignored (once per process).
  for (const std::string& w : unknown_variable_warnings_once()) log_.warn(w);
  const std::string description = cfg_.agreement_description();
  ensure_agreement(*comm_, description);
  setup_hierarchy();
  if (hier_) {
    hier_->leader_phase([&](Comm& leaders) { algo_->attach(leaders); });
  } else {
    algo_->attach(*comm_);
  }
  log_.info("communicator of ", comm_->size(), " ranks, algo ", cfg_.algo, ", config hash ",
            std::hex, config_hash(description), std::dec, " (", description, ")");
}

Communicator::~Communicator() { finish(); }

HierarchyChoice choose_hierarchy(Comm& world, const Config& cfg) {
  HierarchyChoice out;
  // Only compressed calls take the hierarchy; with compression off there is
  // nothing to set up (and no traffic for it).
  if (cfg.hierarchy == "off" || !cfg.compression_enabled()) return out;
  HostLayout layout = exchange_host_layout(world, host_id(cfg.host_id));
  const bool several_hosts = layout.hosts() > 1;
  const bool shared_host = layout.max_local_size() > 1;
  if (cfg.hierarchy != "host" && !(several_hosts && shared_host)) {
    out.why = detail::concat("host hierarchy off (COMPCOLL_HIERARCHY=auto: ",
                             several_hosts ? "every host has one rank" : "all ranks share one host",
                             "; ", layout.describe(), ")");
    return out;
  }
  const bool leader = layout.is_leader(world.rank());
  const int hosts = layout.hosts();
  const std::string described = layout.describe();
  std::unique_ptr<LocalGroup> local = connect_local_group(world, layout);
  out.hierarchy = std::make_unique<Hierarchy>(world, std::move(layout), std::move(local));
  out.why = detail::concat(
      "host hierarchy on (COMPCOLL_HIERARCHY=", cfg.hierarchy, "): ", described, "; this rank ",
      leader ? "leads its host and keeps the error-feedback state" : "follows its host's leader",
      "; ", cfg.algo, " runs between ", hosts, hosts == 1 ? " leader" : " leaders");
  return out;
}

void Communicator::setup_hierarchy() {
  HierarchyChoice choice = choose_hierarchy(*comm_, cfg_);
  hier_ = std::move(choice.hierarchy);
  if (!choice.why.empty()) log_.info(choice.why);
}

void Communicator::finish() {
  if (finished_) return;
  finished_ = true;
  if (!cfg_.stats_file.empty()) {
    const std::string path = stats_path(cfg_.stats_file, comm_->rank());
    if (!write_file_atomically(path, stats_.json(comm_->rank(), comm_->size(), cfg_.algo,
                                                 states_.memory_bytes()))) {
      log_.warn("cannot write COMPCOLL_STATS_FILE ", path);
    }
  }
  log_.info(stats_.summary(cfg_.algo), ", state ", states_.memory_bytes() / 1e6, " MB in ",
            states_.entries(), " tensors");
}

bool Communicator::drop_state(const std::string& key) {
  const bool dropped = states_.erase(StateKey{key, 0, 0, DType::kFloat32});
  if (dropped) log_.trace("dropped the error-feedback state of key:", key);
  return dropped;
}

void Communicator::allreduce(void* buf, size_t count, DType dtype, ReduceOp op, const char* key) {
  CC_CHECK(broken_.empty(), kTransport, "rank ", comm_->rank(),
           ": this communicator failed earlier and must be rebuilt; first error: ", broken_);
  CC_CHECK(buf != nullptr || count == 0, kInvalidArgument, "allreduce of ", count,
           " elements from a null buffer");
  const auto t0 = std::chrono::steady_clock::now();
  const Route route = choose_route(*algo_, count, dtype, op, cfg_.min_elems);
  StateKey skey{key ? key : "", reinterpret_cast<uintptr_t>(buf), count, dtype};
  const std::string skey_text = skey.str();
  CodecState* state = nullptr;
  // Under the hierarchy only leaders compress, so only they keep state, sized
  // for the leaders' communicator.
  const bool hierarchical = route.compressed && hier_ != nullptr;
  if (route.compressed && (!hierarchical || hier_->is_leader())) {
    bool created = false;
    const int algo_world = hierarchical ? hier_->layout().hosts() : comm_->size();
    state = &states_.get(skey, count, [&] { return algo_->make_state(count, algo_world); },
                         &created);
    if (created) log_.trace("new error-feedback state for ", skey_text, " (", count, " elements)");
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
  const uint64_t before = comm_->bytes_sent();
  try {
    if (hierarchical) {
      run_hierarchical(*hier_, *algo_, buf, count, dtype, op, state);
    } else {
      run_allreduce(*comm_, *algo_, route, buf, count, dtype, op, state);
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) broken_ = e.what();
    throw;
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
  const std::string decision = algo_->last_decision();
  if (!decision.empty()) {
    auto& last = decisions_[skey_text];
    // Log when the choice changes, not when only the predicted times move.
    const std::string choice = decision.substr(0, decision.find(' '));
    if (last != choice) {
      last = choice;
      log_.info("auto: ", skey_text, " ", count, " x ", dtype_name(dtype), ": ", decision);
    }
  }
  CallRecord rec;
  rec.compressed = route.compressed && decision.rfind("dense", 0) != 0;
  rec.dense_bytes = ring_allreduce_bytes(count * dtype_size(dtype), comm_->size());
  rec.wire_bytes = comm_->bytes_sent() - before;
  rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stats_.record(rec);
  if (const size_t dropped = states_.tick()) {
    log_.info("evicted ", dropped, " error-feedback states unused for ", kEvictAfterCalls, " calls");
  }
  log_.trace("allreduce ", skey_text, ": ", rec.wire_bytes, " B sent (dense ", rec.dense_bytes,
             " B), ", rec.ms, " ms");
}

}  // namespace compcoll
