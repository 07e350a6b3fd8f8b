// connect_gloo: build a GlooComm from options (rank, size, store, device).
//
// Rendezvous, step by step, all under ONE deadline = start + timeout:
//   1. argument checks and transport selection (no traffic yet);
//   2. join: each rank writes "<prefix>/join/<rank>" = its world size, then
//      waits for all ranks' join keys. A rank that never starts makes every
//      other rank fail here, on time, with the list of missing ranks; a rank
//      started with another world size is a kMismatch error;
//   3. Gloo's connectFullMesh over the same prefixed store (each rank
//      publishes its tcp addresses under "<prefix>/<rank>"), with the time
//      left but at least min(timeout, 2 s). Gloo waits up to 5x the context
//      timeout for a tcp connect, so the context timeout is a fifth of that
//      budget while connecting and `timeout` afterwards.
//
// Address selection for the tcp device: `iface` (e.g. "lo", "eth0") when
// given, else `hostname` (a name or address to bind and publish), else the
// machine's own hostname when it resolves (what Gloo and PyTorch do, so
// multi-host jobs work without configuration), else 127.0.0.1.
//
// Side effect: the first call sets SIGPIPE to SIG_IGN if it is still SIG_DFL.
// Gloo writes to sockets with writev(), which raises SIGPIPE when a peer has
// died; the default action would kill the surviving process instead of
// letting it report the dead peer (Python processes already ignore SIGPIPE).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/gloo_comm.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace compcoll {

struct GlooOptions {
  int rank = -1;
  int size = 0;
  // Exactly one of `store` and `rendezvous`:
  std::shared_ptr<gloo::rendezvous::Store> store;  // e.g. a shared HashStore
  std::string rendezvous;  // "file://DIR" or "redis://HOST:PORT"
  std::string transport = "tcp";  // "tcp" | "ibverbs" (refused: see below)
  std::string iface;     // network interface to bind, e.g. "lo"
  std::string hostname;  // or a hostname/address to bind
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // Namespace inside the store, so several communicators can share one store.
  // Keys are never deleted: a prefix (or directory) serves one communicator.
  std::string prefix = "compcoll";
};

// The transport names connect_gloo accepts.
inline constexpr const char* kAllowedTransports = "tcp, ibverbs";

// Connects this rank; blocks until every rank has joined or the timeout ends.
// Errors (compcoll::Error):
//   kInvalidArgument  rank/size/timeout out of range, unknown transport,
//                     malformed rendezvous spec, both or neither of
//                     store/rendezvous, unusable iface/hostname, reused prefix;
//   kUnsupported      transport "ibverbs" (Gloo's ibverbs device here has no
//                     unbound buffers), raised before any rendezvous traffic;
//   kMismatch         ranks disagree on the world size;
//   kTransport        rendezvous timed out (names the missing ranks), the
//                     store or a tcp connection failed.
std::unique_ptr<GlooComm> connect_gloo(const GlooOptions& options);

}  // namespace compcoll
