// COMPCOLL_NCCL_COMMS=multi-host: does an NCCL communicator span several
// hosts?
//
// The interposer sees buffers, not what they hold, so it cannot tell a
// tensor-parallel layer's allreduce of activations from a gradient sum. What
// it can see is where a communicator's ranks live: in the usual layouts
// (Megatron's, PyTorch's device meshes) tensor parallelism stays within a
// node, on its fast links, while data parallelism crosses nodes, over the
// network compression is for. So multi-host compresses a communicator only
// when its ranks span several hosts, as COMPCOLL_HIERARCHY finds hosts
// (transport/shm_host.h; COMPCOLL_HOST_ID overrides).
//
// Every part of the exchange starts with a tag: a rank that is not in it
// (one with COMPCOLL_NCCL_COMMS=all, creating its Communicator instead) sends
// something else, and is named instead of being taken for a host.
#pragma once

#include <string>

#include "collectives/comm.h"
#include "collectives/host_layout.h"

namespace compcoll::interposer {

struct HostSpan {
  HostLayout layout;
  // "" or why this rank could not tell its host (it then counts as a host of
  // its own, so the communicator is compressed, as the hierarchy does).
  std::string undetected;
  bool several_hosts() const { return layout.hosts() > 1; }
};

// Collective over comm: every rank sends its host id (host_id_override when
// not empty) and gets the same layout. Throws kInvalidArgument, naming the
// rank, when a part lacks the tag, and whatever comm throws (a timeout).
HostSpan exchange_host_span(Comm& comm, const std::string& host_id_override);

}  // namespace compcoll::interposer
