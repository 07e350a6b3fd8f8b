#include "transport/peer_addresses.h"

#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "transport/rendezvous.h"

namespace compcoll {

namespace {

// Gloo's extractAddress: rank j publishes one fixed-size address per peer,
// in rank order, skipping itself.
std::string slice_for(const std::vector<char>& all, int owner, int peer, int size) {
  if (size < 2 || all.empty() || all.size() % static_cast<size_t>(size - 1) != 0) return "";
  const size_t each = all.size() / static_cast<size_t>(size - 1);
  const size_t slot = static_cast<size_t>(peer > owner ? peer - 1 : peer);
  std::vector<char> bytes(all.begin() + static_cast<std::ptrdiff_t>(slot * each),
                          all.begin() + static_cast<std::ptrdiff_t>((slot + 1) * each));
  return gloo::transport::tcp::Address(bytes).str();
}

std::string address_string(const sockaddr_storage& ss, socklen_t len) {
  return gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&ss), len).str();
}

// One address of /proc/net/tcp{,6}: "0100007F:9C40" or 32 hex digits, a
// colon, the port. The kernel prints the address as 32-bit words in host
// byte order, i.e. exactly the bytes of in_addr / in6_addr as stored here.
bool parse_proc_net_address(const std::string& text, sockaddr_storage& ss, socklen_t& len) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return false;
  char* end = nullptr;
  const unsigned long port = std::strtoul(text.c_str() + colon + 1, &end, 16);
  if (*end != '\0' || port > 0xffff) return false;
  auto word = [&](size_t at, uint32_t& w) {
    const std::string hex = text.substr(at, 8);
    char* e = nullptr;
    w = static_cast<uint32_t>(std::strtoul(hex.c_str(), &e, 16));
    return e == hex.c_str() + 8;
  };
  ss = {};
  if (colon == 8) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(static_cast<uint16_t>(port));
    uint32_t w = 0;
    if (!word(0, w)) return false;
    std::memcpy(&sin.sin_addr, &w, 4);
    std::memcpy(&ss, &sin, sizeof sin);
    len = sizeof sin;
    return true;
  }
  if (colon == 32) {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(static_cast<uint16_t>(port));
    for (size_t i = 0; i < 4; ++i) {
      uint32_t w = 0;
      if (!word(8 * i, w)) return false;
      std::memcpy(&sin6.sin6_addr.s6_addr[4 * i], &w, 4);
    }
    std::memcpy(&ss, &sin6, sizeof sin6);
    len = sizeof sin6;
    return true;
  }
  return false;
}

// Local address -> remote address of every established TCP connection of
// this network namespace, read from the kernel's tables (/proc/net/tcp and
// tcp6; none when /proc is unavailable). No file descriptor is touched: a
// scan of /proc/self/fd would fstat/getsockname descriptors that other
// threads (Gloo's device threads, other communicators, the application)
// open and close at the same time, i.e. race with them and possibly look at
// a reused descriptor. Callers match on their own listening address, so
// other processes' connections never match.
std::multimap<std::string, std::string> connected_sockets() {
  std::multimap<std::string, std::string> out;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // column headers
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state) || state != "01") continue;  // ESTABLISHED
      sockaddr_storage l{}, r{};
      socklen_t llen = 0, rlen = 0;
      if (!parse_proc_net_address(local, l, llen) || !parse_proc_net_address(remote, r, rlen)) continue;
      out.emplace(address_string(l, llen), address_string(r, rlen));
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<std::string>> discover_peer_addresses(
    RendezvousStore& store, int rank, int size) {
  std::vector<std::vector<std::string>> out(static_cast<size_t>(size));
  try {
    const std::vector<char> mine = store.get(std::to_string(rank));
    const auto sockets = connected_sockets();
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      auto& names = out[static_cast<size_t>(i)];
      const std::string theirs = slice_for(store.get(std::to_string(i)), i, rank, size);
      if (!theirs.empty()) names.push_back(theirs);
      // Sockets accepted on our listening address for this pair. Several
      // ranks may live in this process; listening ports are unique per pair.
      const std::string ours = slice_for(mine, rank, i, size);
      if (ours.empty()) continue;
      auto [lo, hi] = sockets.equal_range(ours);
      for (auto it = lo; it != hi; ++it) names.push_back(it->second);
    }
  } catch (const std::exception&) {
    // Best effort only.
  }
  return out;
}

std::string name_peer_addresses(const std::string& msg,
                                const std::vector<std::vector<std::string>>& addresses) {
  std::string out;
  for (size_t i = 0; i < addresses.size(); ++i) {
    for (const std::string& addr : addresses[i]) {
      if (!addr.empty() && msg.find(addr) != std::string::npos) {
        out += " (peer " + addr + " is rank " + std::to_string(i) + ")";
      }
    }
  }
  return out;
}

}  // namespace compcoll
