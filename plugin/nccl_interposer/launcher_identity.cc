#include "plugin/nccl_interposer/launcher_identity.h"

#include <charconv>
#include <optional>

namespace compcoll::interposer {
namespace {

std::optional<int> non_negative(const std::optional<std::string>& text) {
  if (!text || text->empty()) return std::nullopt;
  int v = -1;
  const char* end = text->data() + text->size();
  const auto [p, ec] = std::from_chars(text->data(), end, v);
  if (ec != std::errc() || p != end || v < 0) return std::nullopt;
  return v;
}

}  // namespace

LauncherIdentity launcher_identity(const EnvLookup& env) {
  static constexpr const char* kPairs[][2] = {{"RANK", "WORLD_SIZE"},
                                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                              {"PMI_RANK", "PMI_SIZE"},
                                              {"PMIX_RANK", "PMIX_SIZE"},
                                              {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank_var, size_var] : kPairs) {
    const std::optional<int> rank = non_negative(env(rank_var));
    if (!rank) continue;
    LauncherIdentity me;
    me.rank = *rank;
    me.size = non_negative(env(size_var)).value_or(-1);
    me.source = rank_var;
    return me;
  }
  return {};
}

std::string root_state_tag(const LauncherIdentity& me, int comm_rank, int comm_size,
                           int root_ordinal) {
  if (!me.known()) return "";
  if (comm_rank == me.rank && (me.size < 0 || comm_size == me.size)) return "";
  return "p" + std::to_string(me.rank) + "-root" + std::to_string(root_ordinal);
}

}  // namespace compcoll::interposer
