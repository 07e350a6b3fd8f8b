// The C ABI: every entry point converts compcoll::Error (and anything else)
// into a status code and a per-thread message. No exception crosses it.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#include "compcoll/compcoll.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/config.h"

struct compcoll_comm {
  std::unique_ptr<compcoll::Communicator> impl;
  // The exit hook finished it and kept its call slot (under LiveComms::mu):
  // a destroy after that (a static object's destructor) has nothing to do.
  bool finished_at_exit = false;
};

namespace {

thread_local std::string g_last_error;

compcoll_status_t status_of(compcoll::ErrorKind k) {
  using compcoll::ErrorKind;
  switch (k) {
    case ErrorKind::kInvalidArgument: return COMPCOLL_INVALID_ARGUMENT;
    case ErrorKind::kMalformedPayload: return COMPCOLL_MALFORMED_PAYLOAD;
    case ErrorKind::kTransport: return COMPCOLL_TRANSPORT_ERROR;
    case ErrorKind::kMismatch: return COMPCOLL_MISMATCH;
    case ErrorKind::kUnsupported: return COMPCOLL_UNSUPPORTED;
    case ErrorKind::kInternal: return COMPCOLL_INTERNAL_ERROR;
  }
  return COMPCOLL_INTERNAL_ERROR;
}

template <typename Fn>
compcoll_status_t guarded(Fn&& fn) {
  try {
    fn();
    g_last_error.clear();
    return COMPCOLL_SUCCESS;
  } catch (const compcoll::Error& e) {
    g_last_error = e.what();
    return status_of(e.kind());
  } catch (const std::bad_alloc&) {
    g_last_error = "compcoll: out of memory";
    return COMPCOLL_INTERNAL_ERROR;
  } catch (const std::exception& e) {
    g_last_error = std::string("compcoll: ") + e.what();
    return COMPCOLL_INTERNAL_ERROR;
  } catch (...) {
    g_last_error = "compcoll: unknown exception";
    return COMPCOLL_INTERNAL_ERROR;
  }
}

compcoll_status_t null_arg(const char* what) {
  g_last_error = std::string("compcoll: ") + what + " is NULL";
  return COMPCOLL_INVALID_ARGUMENT;
}

bool valid_dtype(int d) { return d >= COMPCOLL_FLOAT32 && d <= COMPCOLL_INT8; }
bool valid_op(int o) { return o >= COMPCOLL_SUM && o <= COMPCOLL_PROD; }

// compcoll_comm_create's arguments replace these, so the environment's are
// neither read nor checked: a framework making a communicator of its own
// inside a launcher's job (torchrun's RANK and WORLD_SIZE, another
// communicator's COMPCOLL_RENDEZVOUS) is not refused for them.
compcoll::EnvLookup env_without_identity() {
  return [env = compcoll::process_env()](const char* name) -> std::optional<std::string> {
    for (const char* given : {"COMPCOLL_RENDEZVOUS", "COMPCOLL_RANK", "COMPCOLL_WORLD_SIZE",
                              "RANK", "WORLD_SIZE"}) {
      if (std::strcmp(name, given) == 0) return std::nullopt;
    }
    return env(name);
  };
}

// Communicators created and not destroyed yet. At process exit each writes
// what compcoll_comm_destroy would (COMPCOLL_STATS_FILE, the
// COMPCOLL_STATE_DIR checkpoint): the stats contract is "at destruction or
// exit", and a C program that returns from main without destroying its
// communicator must not lose them. Leaked on purpose: the exit hook runs
// after static destructors of objects made later than it was registered.
struct LiveComms {
  std::mutex mu;
  // With the process that created each: a forked child's exit leaves its
  // parent's communicators (and files) alone, and finishes its own.
  std::map<compcoll_comm*, pid_t> comms;
};
LiveComms& live_comms() {
  static LiveComms* live = new LiveComms;
  return *live;
}

void finish_live_comms_at_exit() {
  LiveComms& live = live_comms();
  const pid_t self = getpid();
  std::lock_guard<std::mutex> lock(live.mu);
  for (const auto& [c, pid] : live.comms) {
    // Takes the communicator's call slot and keeps it: one inside a call on
    // another thread is left alone (finishing it would read what that call
    // writes), and a call another thread starts later is refused.
    if (pid != self || !c->impl->enter_final_call()) continue;
    c->finished_at_exit = true;
    try {
      c->impl->finish();
    } catch (...) {  // nothing may escape an exit hook; finish logs its own failures
    }
  }
}

compcoll_status_t create(const compcoll::Config& cfg, compcoll_comm_t** out) {
  return guarded([&] {
    auto c = new compcoll_comm{compcoll::Communicator::connect(cfg)};
    static std::once_flag hook;
    std::call_once(hook, [] {
      live_comms();
      std::atexit(finish_live_comms_at_exit);
    });
    {
      LiveComms& live = live_comms();
      std::lock_guard<std::mutex> lock(live.mu);
      live.comms.emplace(c, getpid());
    }
    *out = c;
  });
}

}  // namespace

extern "C" {

compcoll_status_t compcoll_comm_create_from_env(compcoll_comm_t** comm) {
  if (!comm) return null_arg("comm");
  *comm = nullptr;
  compcoll::Config cfg;
  const compcoll_status_t s = guarded([&] { cfg = compcoll::load_config(); });
  return s != COMPCOLL_SUCCESS ? s : create(cfg, comm);
}

compcoll_status_t compcoll_comm_create(const char* rendezvous, int rank, int world_size,
                                       compcoll_comm_t** comm) {
  if (!comm) return null_arg("comm");
  *comm = nullptr;  // on every failure, as compcoll_comm_create_from_env
  if (!rendezvous) return null_arg("rendezvous");
  compcoll::Config cfg;
  const compcoll_status_t s = guarded([&] {
    CC_CHECK(*rendezvous != '\0', kInvalidArgument,
             "compcoll_comm_create: the rendezvous is empty (file://DIR or redis://HOST:PORT)");
    cfg = compcoll::load_config(env_without_identity());
    CC_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, kInvalidArgument, "rank ", rank,
             " of world size ", world_size, " is out of range");
    cfg.rendezvous = rendezvous;
    cfg.rank = rank;
    cfg.world_size = world_size;
  });
  return s != COMPCOLL_SUCCESS ? s : create(cfg, comm);
}

compcoll_status_t compcoll_allreduce(compcoll_comm_t* comm, void* buf, size_t count,
                                     compcoll_dtype_t dtype, compcoll_op_t op, const char* key) {
  if (!comm) return null_arg("comm");
  if (!valid_dtype(dtype)) {
    g_last_error = "compcoll: unknown dtype " + std::to_string(dtype);
    return COMPCOLL_INVALID_ARGUMENT;
  }
  if (!valid_op(op)) {
    g_last_error = "compcoll: unknown reduction op " + std::to_string(op);
    return COMPCOLL_INVALID_ARGUMENT;
  }
  return guarded([&] {
    comm->impl->allreduce(buf, count, static_cast<compcoll::DType>(dtype),
                          static_cast<compcoll::ReduceOp>(op), key);
  });
}

compcoll_status_t compcoll_comm_rank(const compcoll_comm_t* comm, int* rank) {
  if (!comm || !rank) return null_arg("comm or rank");
  *rank = comm->impl->rank();
  g_last_error.clear();
  return COMPCOLL_SUCCESS;
}

compcoll_status_t compcoll_comm_size(const compcoll_comm_t* comm, int* size) {
  if (!comm || !size) return null_arg("comm or size");
  *size = comm->impl->size();
  g_last_error.clear();
  return COMPCOLL_SUCCESS;
}

compcoll_status_t compcoll_get_stats(const compcoll_comm_t* comm, compcoll_stats_t* stats) {
  if (!comm || !stats) return null_arg("comm or stats");
  // As of the last finished call: another thread may be inside one.
  const compcoll::Communicator::StatsSnapshot snap = comm->impl->stats_snapshot();
  const compcoll::StatsCounters& s = snap.counters;
  stats->calls = s.calls;
  stats->compressed_calls = s.compressed_calls;
  stats->dense_bytes = s.dense_bytes;
  stats->wire_bytes = s.wire_bytes;
  stats->ratio = s.ratio();
  stats->time_ms = s.ms;
  stats->state_bytes = snap.state_bytes;
  g_last_error.clear();
  return COMPCOLL_SUCCESS;
}

compcoll_status_t compcoll_get_steady_stats(const compcoll_comm_t* comm,
                                            compcoll_steady_stats_t* stats) {
  if (!comm || !stats) return null_arg("comm or stats");
  const compcoll::StatsCounters s = comm->impl->stats_snapshot().counters;
  stats->warmup_dense_calls = s.warmup_dense_calls;
  stats->steady_calls = s.steady_calls;
  stats->steady_dense_bytes = s.steady_dense_bytes;
  stats->steady_wire_bytes = s.steady_wire_bytes;
  stats->steady_ratio = s.steady_ratio();
  g_last_error.clear();
  return COMPCOLL_SUCCESS;
}

compcoll_status_t compcoll_rescale_state(compcoll_comm_t* comm, double factor,
                                         size_t* rescaled) {
  if (!comm) return null_arg("comm");
  return guarded([&] {
    // Checked as given: a finite double > 0 outside float's range is named
    // as such, not as the 0 or inf it would narrow to.
    CC_CHECK(std::isfinite(factor) && factor > 0.0, kInvalidArgument,
             "the error-feedback state can only be rescaled by a finite factor > 0, got ", factor);
    CC_CHECK(factor >= std::numeric_limits<float>::min() &&
                 factor <= std::numeric_limits<float>::max(),
             kInvalidArgument, "rescale factor ", factor, " is outside the range of float32 [",
             std::numeric_limits<float>::min(), ", ", std::numeric_limits<float>::max(),
             "] the state is kept in");
    const size_t n = comm->impl->rescale_state(static_cast<float>(factor));
    if (rescaled != nullptr) *rescaled = n;
  });
}

compcoll_status_t compcoll_set_loss_scaled(compcoll_comm_t* comm, int on) {
  if (!comm) return null_arg("comm");
  return guarded([&] { comm->impl->set_discard_nonfinite(on != 0); });
}

compcoll_status_t compcoll_comm_destroy(compcoll_comm_t* comm) {
  if (!comm) {
    g_last_error.clear();
    return COMPCOLL_SUCCESS;
  }
  // Takes the call slot and keeps it: freeing the communicator under a call
  // running on another thread crashed that call. Refused at once instead,
  // as any call made during another one is; nothing is freed.
  if (!comm->impl->enter_final_call()) {
    {
      LiveComms& live = live_comms();
      std::lock_guard<std::mutex> lock(live.mu);
      if (comm->finished_at_exit) {
        // The process is exiting and the hook wrote what destroy would:
        // done (freed with the process, not under static destructors).
        live.comms.erase(comm);
        g_last_error.clear();
        return COMPCOLL_SUCCESS;
      }
    }
    g_last_error =
        "compcoll: compcoll_comm_destroy entered while a call of this communicator was running "
        "on another thread; nothing was freed: destroy it once that call has returned";
    return COMPCOLL_INVALID_ARGUMENT;
  }
  {
    LiveComms& live = live_comms();
    std::lock_guard<std::mutex> lock(live.mu);
    live.comms.erase(comm);
  }
  const compcoll_status_t s = guarded([&] { comm->impl->finish(); });
  delete comm;
  return s;
}

const char* compcoll_status_string(compcoll_status_t status) {
  switch (status) {
    case COMPCOLL_SUCCESS: return "success";
    case COMPCOLL_INVALID_ARGUMENT: return "invalid argument";
    case COMPCOLL_MALFORMED_PAYLOAD: return "malformed payload";
    case COMPCOLL_TRANSPORT_ERROR: return "transport error";
    case COMPCOLL_MISMATCH: return "configuration mismatch";
    case COMPCOLL_UNSUPPORTED: return "unsupported";
    case COMPCOLL_INTERNAL_ERROR: return "internal error";
  }
  return "unknown status";
}

const char* compcoll_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
