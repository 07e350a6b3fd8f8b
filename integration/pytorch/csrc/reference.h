// A reference for the tests: compcoll's own algorithms run on P threads of
// this process over an in-memory Comm, with no torch communication at all.
// The torch backend's results are compared with it: a compressed allreduce
// through torch's Gloo must give what compcoll itself gives.
//
// The in-memory allreduce sums in rank order. Gloo's ring sums in another
// order, so results that go through a dense allreduce of more than two
// ranks (csc) may differ in the last bits; with two ranks the orders agree
// (a + b == b + a), and sparse-allgather and onebit results never depend on
// it (payloads are decoded in rank order on every rank).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace compcoll::torch_integration {

// inputs[step][rank]: float32 tensors, the same size for a given step.
// config: COMPCOLL_* variables (anything else of the environment is ignored).
// Runs, per step, an allreduce (SUM, or AVG when average) of every rank's
// input through a Communicator of world_size = inputs[0].size() ranks, with
// one error-feedback key per rank; returns outputs[step][rank].
std::vector<std::vector<at::Tensor>> reference_allreduce(
    const std::map<std::string, std::string>& config,
    const std::vector<std::vector<at::Tensor>>& inputs, bool average);

}  // namespace compcoll::torch_integration
