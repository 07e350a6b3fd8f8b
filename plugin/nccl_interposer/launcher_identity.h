// Which process of the job this is, as its launcher says (torchrun's RANK
// and WORLD_SIZE, Open MPI's, PMI's, Slurm's): what names a process's files
// when several of its NCCL communicators have the same rank and size.
//
// NCCL itself never says: every communicator made by ncclCommInitRank is a
// root, and two processes' roots of the same rank and size (a data-parallel
// pair {0,1} and another {2,3}: both "rank 0 of 2") are indistinguishable.
// Their COMPCOLL_STATE_DIR checkpoints and COMPCOLL_STATS_FILE files would be
// one file written by two processes, and a resumed job would load another
// group's residuals into this one. With the launcher's rank, a root that is
// not the job's world communicator gets a name of its process and its place
// among that process's roots (root_state_tag below); a process's stats file
// is named by the launcher's rank.
#pragma once

#include <string>

#include "plugin/config.h"

namespace compcoll::interposer {

struct LauncherIdentity {
  int rank = -1;  // -1: no launcher variable names this process
  int size = -1;  // -1: unknown
  std::string source;  // the variable the rank came from ("RANK", ...)
  bool known() const { return rank >= 0; }
};

// The first of RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE,
// PMIX_RANK/PMIX_SIZE, SLURM_PROCID/SLURM_NTASKS whose rank is a valid
// non-negative integer; a size that is missing or not a number stays -1.
LauncherIdentity launcher_identity(const EnvLookup& env = process_env());

// The COMPCOLL_STATE_DIR tag of a root communicator (rank comm_rank of
// comm_size), the root_ordinal-th this process made: "" for the job's world
// (its rank and size are the launcher's) or when the launcher is unknown,
// else "p<rank>-root<ordinal>", the same in every run of the same program.
std::string root_state_tag(const LauncherIdentity& me, int comm_rank, int comm_size,
                           int root_ordinal);

}  // namespace compcoll::interposer
