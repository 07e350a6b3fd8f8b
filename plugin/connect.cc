// Communicator::connect: the Gloo transport behind compcoll.h. Kept apart
// from communicator.cc so that integrations that bring their own transport
// (the PyTorch backend) build the communicator without Gloo.
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/config.h"
#include "plugin/logging.h"
#include "transport/gloo_comm.h"
#include "transport/gloo_connect.h"

namespace compcoll {

std::unique_ptr<Communicator> Communicator::connect(const Config& cfg) {
  CC_CHECK(!cfg.rendezvous.empty(), kInvalidArgument,
           "COMPCOLL_RENDEZVOUS is not set (file://DIR or redis://HOST:PORT)");
  // Here, where the tcp device is built (a tool that binds nothing reads
  // both without harm), naming the variables rather than the device's terms.
  CC_CHECK(cfg.iface.empty() || cfg.hostname.empty(), kInvalidArgument, "COMPCOLL_IFACE=",
           cfg.iface, " and COMPCOLL_HOSTNAME=", cfg.hostname, " are both set: the tcp device "
           "binds to an interface or to an address, so unset one of them");
  const auto unset_or = [](int v) { return v < 0 ? std::string("unset") : std::to_string(v); };
  CC_CHECK(cfg.rank >= 0 && cfg.world_size >= 1, kInvalidArgument,
           "COMPCOLL_RANK and COMPCOLL_WORLD_SIZE (or RANK and WORLD_SIZE) must be set; the rank "
           "is ", unset_or(cfg.rank), " and the world size ", unset_or(cfg.world_size));
  // A misspelt COMPCOLL_* name is said before the rendezvous (once per
  // process; the Communicator then has nothing left to say): a misspelt
  // timeout matters most when the rendezvous is what never finishes.
  const Logger log(cfg.debug, cfg.rank);
  for (const std::string& w : unknown_variable_warnings_once()) log.warn(w);
  GlooOptions o;
  o.rank = cfg.rank;
  o.size = cfg.world_size;
  o.rendezvous = cfg.rendezvous;
  o.transport = cfg.transport;
  o.iface = cfg.iface;
  o.hostname = cfg.hostname;
  o.timeout = cfg.timeout;
  // The rendezvous, then the agreement on the configuration (the
  // communicator's first collective): both wait for every rank.
  try {
    return std::make_unique<Communicator>(connect_gloo(o), cfg);
  } catch (const TimeoutError& e) {
    throw naming_timeout_setting(e, cfg, "raise it for ranks that start slowly");
  }
}

}  // namespace compcoll
