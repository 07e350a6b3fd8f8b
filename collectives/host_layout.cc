#include "collectives/host_layout.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "compcoll/error.h"

namespace compcoll {

int HostLayout::local_rank(int rank) const {
  const auto& m = members[static_cast<size_t>(host_of[static_cast<size_t>(rank)])];
  return static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
}

int HostLayout::max_local_size() const {
  size_t most = 0;
  for (const auto& m : members) most = std::max(most, m.size());
  return static_cast<int>(most);
}

int HostLayout::min_local_size() const {
  size_t fewest = members.empty() ? 0 : members.front().size();
  for (const auto& m : members) fewest = std::min(fewest, m.size());
  return static_cast<int>(fewest);
}

std::vector<int> HostLayout::slice_members(int j) const {
  CC_CHECK(j >= 0 && j < min_local_size(), kInternal, "slice ", j, " of a layout whose smallest host has ",
           min_local_size(), " ranks");
  std::vector<int> out;
  for (const auto& m : members) out.push_back(m[static_cast<size_t>(j)]);
  return out;
}

std::vector<int> HostLayout::leaders() const {
  std::vector<int> out;
  for (int h = 0; h < hosts(); ++h) out.push_back(leader(h));
  return out;
}

std::string HostLayout::describe() const {
  std::ostringstream os;
  os << hosts() << (hosts() == 1 ? " host:" : " hosts:");
  for (const auto& m : members) {
    os << " {";
    for (size_t i = 0; i < m.size(); ++i) os << (i ? "," : "") << m[i];
    os << "}";
  }
  return os.str();
}

HostLayout HostLayout::from_ids(const std::vector<std::string>& ids) {
  HostLayout out;
  std::map<std::string, int> index;  // id -> host index, in order of first (lowest) rank
  for (size_t r = 0; r < ids.size(); ++r) {
    CC_CHECK(!ids[r].empty(), kInvalidArgument, "rank ", r, " has an empty host id");
    const auto [it, fresh] = index.emplace(ids[r], static_cast<int>(out.members.size()));
    if (fresh) out.members.emplace_back();
    out.members[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
    out.host_of.push_back(it->second);
  }
  return out;
}

HostLayout exchange_host_layout(Comm& world, const std::string& my_host_id) {
  return HostLayout::from_ids(gather_strings(world, my_host_id, kMaxHostIdBytes, "host id"));
}

}  // namespace compcoll
