// Which ranks share a host, for the two-level hierarchy (hierarchical.h).
//
// Terms:
//   host id     an opaque string every rank computes for itself; ranks with
//               equal ids share a kernel and a network namespace, so they can
//               reach each other through POSIX shared memory and share one
//               network interface (transport/shm_host.h computes it).
//   host index  hosts are numbered in the order of their lowest world rank,
//               so host 0 always holds world rank 0.
//   leader      the lowest world rank of a host; it alone talks to other hosts.
//   local rank  a rank's position among its host's ranks, in world order; the
//               leader is local rank 0.
// Every rank derives the same layout from the same gathered ids.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/comm.h"

namespace compcoll {

// Host ids longer than this are refused (they are a few dozen bytes).
constexpr size_t kMaxHostIdBytes = 256;

struct HostLayout {
  std::vector<int> host_of;               // world rank -> host index
  std::vector<std::vector<int>> members;  // host index -> its world ranks, ascending

  int world() const { return static_cast<int>(host_of.size()); }
  int hosts() const { return static_cast<int>(members.size()); }
  int leader(int host) const { return members[static_cast<size_t>(host)].front(); }
  bool is_leader(int rank) const { return leader(host_of[static_cast<size_t>(rank)]) == rank; }
  int local_rank(int rank) const;
  int local_size(int rank) const {
    return static_cast<int>(members[static_cast<size_t>(host_of[static_cast<size_t>(rank)])].size());
  }
  int max_local_size() const;
  int min_local_size() const;
  // The world ranks of local rank j of every host, by host index (every host
  // must have more than j ranks): slice j's ranks under COMPCOLL_HIERARCHY=shards.
  std::vector<int> slice_members(int j) const;
  // The world ranks of the leaders, by host index.
  std::vector<int> leaders() const;
  // "3 hosts: {0,1} {2,3} {4}"
  std::string describe() const;

  // ids[r] is world rank r's host id. Throws kInvalidArgument for an empty id.
  static HostLayout from_ids(const std::vector<std::string>& ids);
};

// Collective over `world`: every rank contributes its id (at most
// kMaxHostIdBytes; longer is kInvalidArgument before any traffic) and gets
// the same layout.
HostLayout exchange_host_layout(Comm& world, const std::string& my_host_id);

}  // namespace compcoll
