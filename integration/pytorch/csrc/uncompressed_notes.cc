#include "integration/pytorch/csrc/uncompressed_notes.h"

#include <cstdint>

namespace compcoll::torch_integration {
namespace {

// Why a gradient-like sum is outside what compcoll compresses: the key it
// is reported under, and what to tell the user; empty when it is not one.
struct Reason {
  std::string key;
  std::string advice;
};

bool is_sum_or_average(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
}

Reason reason_for(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                  size_t min_elems, c10::DeviceType lane) {
  // One tensor per call is what torch's all_reduce passes; other forms are
  // not gradient buckets.
  if (tensors.size() != 1 || !is_sum_or_average(op)) return {};
  const at::Tensor& t = tensors[0];
  if (!at::isFloatingType(t.scalar_type())) return {};
  if (static_cast<uint64_t>(t.numel()) < min_elems) return {};
  if (t.layout() == at::kSparse) {
    // Exact, and already small on the wire: right, but a user whose largest
    // parameter is a sparse embedding would otherwise see nothing compressed
    // and no reason for it.
    return {"sparse",
            "a sparse tensor (the gradient of an nn.Embedding(sparse=True), say), which is "
            "reduced exactly in its own sparse form (only the rows a batch touched); compcoll "
            "compresses dense tensors, so a dense embedding gradient (sparse=False) would be "
            "compressed like the others"};
  }
  if (t.layout() != at::kStrided) return {};
  if (t.device().type() != lane) {
    const std::string type = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
    return {"device " + type,
            "a " + t.device().str() + " tensor, and this group has no " + type +
                " lane (a group made by init_process_group(\"gloo\") through compcoll's hook, "
                "or a torch without NCCL): create the group with "
                "init_process_group(\"compcoll\") to compress them (docs/pytorch.md, the cuda "
                "lane)"};
  }
  const at::ScalarType st = t.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) {
    const std::string name = st == at::kDouble ? "float64" : c10::toString(st);
    // The advice fits the usual case, a float64 model; other floating types
    // (float8 variants) get the list alone.
    const std::string advice = st == at::kDouble
                                   ? " (a model in float64 keeps its gradients in float64; "
                                     "train it in float32 to compress them)"
                                   : "";
    return {name, "a " + name +
                      " tensor: compcoll compresses float32, float16 and bfloat16" + advice};
  }
  if (!t.is_contiguous()) {
    return {"non-contiguous",
            "a non-contiguous view (a transpose, a strided slice): compcoll compresses "
            "contiguous tensors; reduce t.contiguous() and copy the result back"};
  }
  return {};
}

// "an all_reduce (SUM, 1000 elements)": how every note names its call.
std::string call_label(const c10d::ReduceOp& op, int64_t numel) {
  return "an all_reduce (" + std::string(op == c10d::ReduceOp::AVG ? "AVG" : "SUM") + ", " +
         std::to_string(numel) + " elements)";
}

}  // namespace

std::string UncompressedNotes::first_report(const std::vector<at::Tensor>& tensors,
                                            const c10d::ReduceOp& op, size_t min_elems,
                                            c10::DeviceType lane, const char* inner) {
  const Reason r = reason_for(tensors, op, min_elems, lane);
  if (r.key.empty() || !first_time(r.key)) return {};
  return call_label(op, tensors[0].numel()) + " went to " + inner +
         " uncompressed, as will every call like it: it is " + r.advice +
         ". Said once per reason and group; such calls are not in compcoll's stats "
         "(docs/pytorch.md, \"What happens to each operation\")";
}

bool UncompressedNotes::first_time(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return reported_.insert(key).second;
}

std::string UncompressedNotes::first_outside_backward(int64_t numel, const c10d::ReduceOp& op,
                                                      GradientsCompressed gradients_compressed) {
  if (!first_time("outside backward")) return {};
  const std::string what =
      call_label(op, numel) +
      " issued outside a backward pass took the exact dense path, as will every call like it: "
      "compcoll compresses the gradient sums that DDP (and its comm hooks) issue during "
      "backward, since an allreduce of values (parameters being averaged, evaluation results, "
      "activations) would lose most of its entries to sparsification. ";
  const std::string remedy =
      "set COMPCOLL_TORCH_SCOPE=all on every rank, or issue them in compcoll.gradient_scope(). "
      "Said once per group (docs/pytorch.md, \"Which allreduces are compressed\")";
  if (gradients_compressed != GradientsCompressed::kNowhere) {
    return what +
           (gradients_compressed == GradientsCompressed::kInThisGroup
                ? "This group already compresses the allreduces issued in backward, so these "
                  "are taken as values (periodic model averaging, say), "
                : "Another compcoll group of this process already compresses the allreduces "
                  "issued in backward, so these are taken as values (model averaging over a "
                  "subgroup, as HierarchicalModelAverager's, say), ") +
           "for which exact is right. If they are gradients reduced by a loop of your own, " +
           remedy;
  }
  return what +
         "If these are gradients (a loop of your own that allreduces .grad after backward()), " +
         remedy;
}

std::string UncompressedNotes::first_tensor_parallel(int64_t numel, const c10d::ReduceOp& op) {
  if (!first_time("tensor parallel")) return {};
  return call_label(op, numel) +
         " took the exact dense path, as will every allreduce of this group, in backward "
         "too: the group carries tensor parallelism (DTensor), whose allreduces sum one "
         "batch's activations or their gradients, which a residual carried into the next "
         "batch would corrupt. The data-parallel gradient sums of other groups (DDP, FSDP, "
         "HSDP) are compressed as before. Said once per group (docs/pytorch.md, \"Which "
         "allreduces are compressed\")";
}

std::string UncompressedNotes::first_coalesced(const std::vector<at::Tensor>& tensors,
                                               const c10d::ReduceOp& op, size_t min_elems) {
  if (op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG) return {};
  int64_t numel = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.is_floating_point()) return {};
    numel += t.numel();
  }
  if (static_cast<size_t>(numel) < min_elems || !first_time("coalesced")) return {};
  return "an all_reduce_coalesced (" + std::string(op == c10d::ReduceOp::AVG ? "AVG" : "SUM") +
         ", " + std::to_string(tensors.size()) + " tensors, " + std::to_string(numel) +
         " elements) went to Gloo uncompressed, as will every call like it: compcoll compresses "
         "all_reduce, one tensor per call (torch deprecates all_reduce_coalesced); for gradient "
         "sums, all_reduce each tensor, or one flat buffer of them. Said once per group; such "
         "calls are not in compcoll's stats (docs/pytorch.md, \"What happens to each "
         "operation\")";
}

std::string UncompressedNotes::first_activations(int64_t numel, const c10d::ReduceOp& op,
                                                 const std::string& where) {
  if (!first_time("activations in backward")) return {};
  return call_label(op, numel) + " issued in a backward pass " + where +
         " took the exact dense path, as will every call like it: one issued there is "
         "activation checkpointing's recomputation of a forward allreduce "
         "(torch.utils.checkpoint) or the backward of torch.distributed.nn.functional."
         "all_reduce, which sum activations or their gradients, not parameters' gradients, and "
         "a residual carried into the next batch would corrupt them. DDP's and FSDP's gradient "
         "sums are compressed as before. Said once per group (docs/pytorch.md, \"Which "
         "allreduces are compressed\")";
}

}  // namespace compcoll::torch_integration
