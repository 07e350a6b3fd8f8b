#include "transport/peer_addresses.h"

#include <dirent.h>
#include <gloo/transport/tcp/address.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

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

// Local address -> remote address of every connected TCP socket of this
// process (found through /proc/self/fd; none when /proc is unavailable).
std::multimap<std::string, std::string> connected_sockets() {
  std::multimap<std::string, std::string> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, remote{};
    socklen_t llen = sizeof(local), rlen = sizeof(remote);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&remote), &rlen) != 0) {
      continue;
    }
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
    out.emplace(address_string(local, llen), address_string(remote, rlen));
  }
  closedir(dir);
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

}  // namespace compcoll
