#include "transport/gloo_connect.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "compcoll/error.h"
#include "transport/peer_addresses.h"
#include "transport/rdma_probe.h"
#include "transport/rendezvous.h"

namespace compcoll {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

// The machine's hostname if it resolves to an address, else 127.0.0.1.
std::string default_hostname() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') {
    return "127.0.0.1";
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name.data(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return "127.0.0.1";
  }
  freeaddrinfo(res);
  return name.data();
}

std::shared_ptr<gloo::transport::Device> make_tcp_device(const GlooOptions& o) {
  CC_CHECK(o.iface.empty() || o.hostname.empty(), kInvalidArgument,
           "give a network interface (iface '", o.iface, "') or a hostname ('",
           o.hostname, "') for the tcp transport, not both");
  gloo::transport::tcp::attr attr;
  std::string what;
  if (!o.iface.empty()) {
    attr.iface = o.iface;
    what = "network interface '" + o.iface + "'";
  } else {
    attr.hostname = o.hostname.empty() ? default_hostname() : o.hostname;
    what = "hostname/address '" + attr.hostname + "'";
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    CC_THROW(kInvalidArgument, "rank ", o.rank, ": cannot open the tcp device on ",
             what, ": ", e.what());
  }
}

[[noreturn]] void refuse_ibverbs() {
  CC_THROW(kUnsupported,
           "COMPCOLL_TRANSPORT=ibverbs: Gloo's ibverbs device in this build has "
           "no unbound-buffer support (needed by compcoll's collectives), and ",
           describe_rdma(probe_rdma()), "; use transport tcp");
}

std::string join_key(int rank) { return "join/" + std::to_string(rank); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Step 2 of the rendezvous (see gloo_connect.h).
void join(RendezvousStore& store, const GlooOptions& o, milliseconds timeout) {
  const std::string mine = std::to_string(o.size);
  store.set(join_key(o.rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < o.size; ++r) keys.push_back(join_key(r));
  const std::vector<std::string> missing = store.wait_for_all(keys);
  if (!missing.empty()) {
    std::vector<int> absent;
    for (int r = 0; r < o.size; ++r) {
      const std::string full =
          store.prefix().empty() ? join_key(r) : store.prefix() + "/" + join_key(r);
      if (std::find(missing.begin(), missing.end(), full) != missing.end()) {
        absent.push_back(r);
      }
    }
    CC_THROW_TIMEOUT(timeout, "rank ", o.rank, "/", o.size,
             ": rendezvous timed out after ", timeout.count(), " ms: rank(s) ",
             rank_list(absent), " never joined (prefix '", store.prefix(),
             "'). Check that every rank was started with the same rendezvous "
             "store and prefix, and that no rank crashed during start-up.");
  }
  for (int r = 0; r < o.size; ++r) {
    const std::vector<char> v = store.get(join_key(r));
    const std::string theirs(v.begin(), v.end());
    CC_CHECK(theirs == mine, kMismatch, "rank ", o.rank,
             ": world size mismatch: this rank was started with size ", o.size,
             " but rank ", r, " with size ", theirs);
  }
}

}  // namespace

std::unique_ptr<GlooComm> connect_gloo(const GlooOptions& given) {
  const auto start = steady_clock::now();
  GlooOptions o = given;
  // redis://HOST:PORT/JOB: the job's keys live under its name (subgroups
  // inherit the prefix: their options carry the store, not the spec).
  if (!o.rendezvous.empty()) {
    if (const std::string job = parse_store_spec(o.rendezvous).job; !job.empty()) {
      o.prefix += "/" + job;
    }
  }
  CC_CHECK(o.size >= 1, kInvalidArgument, "world size must be >= 1, got ", o.size);
  CC_CHECK(o.rank >= 0 && o.rank < o.size, kInvalidArgument, "rank ", o.rank,
           " is outside [0, ", o.size, ")");
  CC_CHECK(o.timeout.count() > 0, kInvalidArgument,
           "timeout must be positive, got ", o.timeout.count(), " ms");
  if (o.transport == "ibverbs") refuse_ibverbs();
  CC_CHECK(o.transport == "tcp" || o.transport.empty(), kInvalidArgument,
           "unknown transport '", o.transport, "': allowed values are ",
           kAllowedTransports);
  CC_CHECK((o.store != nullptr) != !o.rendezvous.empty(), kInvalidArgument,
           "give exactly one of a rendezvous store object and a rendezvous "
           "spec (file://DIR or redis://HOST:PORT); got ",
           o.store ? "both" : "neither");

  std::shared_ptr<gloo::rendezvous::Store> base =
      o.store ? o.store : make_store(o.rendezvous, o.timeout);
  auto device = make_tcp_device(o);
  ignore_sigpipe_once();

  const auto deadline = start + o.timeout;
  RendezvousStore store(base, o.prefix, deadline, o.timeout);
  join(store, o, o.timeout);

  // Everyone is here. Connecting gets the time left, but at least
  // min(timeout, 2 s), so ranks that joined just in time are not failed by
  // a deadline that only the slowest of them used up.
  const auto now = steady_clock::now();
  const auto connect_deadline =
      std::max(deadline, now + std::min(o.timeout, milliseconds(2000)));
  RendezvousStore connect_store(base, o.prefix, connect_deadline, o.timeout);
  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  const auto left = std::chrono::ceil<milliseconds>(connect_deadline - now);
  context->setTimeout(std::max(left / 5, milliseconds(1)));
  try {
    context->connectFullMesh(connect_store, device);
  } catch (const Error&) {
    throw;  // our own store's errors already say what went wrong
  } catch (const std::exception& e) {
    const std::string why = e.what();
    // Gloo names the peer by its address only; the store says whose it is
    // (what is there now: a rank that never published is not waited for).
    RendezvousStore lookup(base, o.prefix, steady_clock::now() + milliseconds(200), o.timeout);
    const std::string named =
        name_peer_addresses(why, discover_peer_addresses(lookup, o.rank, o.size));
    if (why.find("Timed out") != std::string::npos || why.find("Connect timeout") != std::string::npos) {
      CC_THROW_TIMEOUT(o.timeout, "rank ", o.rank, "/", o.size,
                       ": connecting to peers timed out (a rank may have died after joining "
                       "or be unreachable at its published address): ",
                       why, named);
    }
    CC_THROW(kTransport, "rank ", o.rank, "/", o.size,
             ": connecting to peers failed (a rank may have died after joining "
             "or be unreachable at its published address): ",
             why, named);
  }
  context->setTimeout(o.timeout);
  auto comm = std::make_unique<GlooComm>(context, o.timeout,
                                         discover_peer_addresses(connect_store, o.rank, o.size));
  // Subgroups rendezvous through the same store under this communicator's
  // prefix, with the same device settings and timeout.
  GlooOptions parent = o;
  parent.store = base;
  parent.rendezvous.clear();
  comm->set_subgroup_connector([parent](const std::vector<int>& members, const std::string& name) {
    GlooOptions s = parent;
    s.rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank) - members.begin());
    s.size = static_cast<int>(members.size());
    s.prefix = parent.prefix + "/subgroup/" + name;
    return connect_gloo(s);
  });
  return comm;
}

}  // namespace compcoll
