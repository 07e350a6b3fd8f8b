#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace compcoll::torch_integration {

// Why an all_reduce that looks like a gradient sum (floating point, SUM or
// AVG, at least COMPCOLL_MIN_ELEMS elements) was not one compcoll could
// compress: float64, a non-contiguous view, a cuda tensor in a group with
// no cuda lane. Such a call goes to Gloo (or NCCL) unchanged, which is
// right, but with COMPCOLL_ALGO set a float64 model, or a GPU script whose
// init_process_group("gloo") compcoll took over, would otherwise train with
// nothing compressed and nothing said. Each reason is reported once per
// process group (the caller logs it, by rank 0). Integer tensors and
// MIN/MAX/PRODUCT are not gradient sums: they pass without a word.
class UncompressedNotes {
 public:
  // The sentence to log for this call, or "" when it is not a gradient-like
  // sum or its reason was already reported. lane: the device type of the
  // lane the call went to; inner: its backend ("Gloo" or "NCCL").
  std::string first_report(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                           size_t min_elems, c10::DeviceType lane, const char* inner);
  // The same for a call compcoll could compress but that was issued outside
  // a backward pass (COMPCOLL_TORCH_SCOPE=backward, issue_scope.h), once.
  // gradients_compressed: this group, or another compcoll group of the
  // process, has compressed allreduces issued in backward before (DDP's
  // buckets), so this one is most likely values (periodic model averaging,
  // hierarchical averaging over subgroups that carry no gradients, an
  // evaluation result) and exact is right: the note says so, for an INFO
  // line rather than a warning.
  enum class GradientsCompressed { kNowhere, kInThisGroup, kInAnotherGroup };
  std::string first_outside_backward(int64_t numel, const c10d::ReduceOp& op,
                                     GradientsCompressed gradients_compressed);
  // The same for one of a tensor-parallel group (mark_tensor_parallel),
  // which is exact by design: an INFO line, once.
  std::string first_tensor_parallel(int64_t numel, const c10d::ReduceOp& op);
  // all_reduce_coalesced of floating-point tensors, SUM or AVG, of at least
  // min_elems in all: delegated unchanged (compcoll compresses one tensor
  // per allreduce), said once at WARN; "" for any other such call.
  std::string first_coalesced(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                              size_t min_elems);
  // The same for one issued in backward that sums activations or their
  // gradients (issue_scope.h: activations_node, ValuesKind::kRecomputation),
  // `where` ("while autograd evaluated MulBackward0"): exact by design, an
  // INFO line, once.
  std::string first_activations(int64_t numel, const c10d::ReduceOp& op, const std::string& where);

 private:
  // True the first time key is asked about, false after (thread-safe).
  bool first_time(const std::string& key);

  std::mutex mu_;
  std::set<std::string> reported_;
};

}  // namespace compcoll::torch_integration
