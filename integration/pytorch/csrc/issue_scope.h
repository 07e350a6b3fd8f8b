// COMPCOLL_TORCH_SCOPE=backward (the default): the PyTorch backend
// compresses only allreduces issued during a backward pass. Those are the
// gradient sums compression is for: DDP issues its buckets' allreduces from
// autograd hooks, inside the backward pass, whatever its options. An
// allreduce issued elsewhere may carry values (parameters being averaged,
// evaluation results, activations), and sparsifying a value leaves most of
// its entries at zero, with the rest waiting in a residual.
//
// The calling thread is in a backward pass when autograd runs a graph task
// on it. A callback of a compcoll operation (DDP comm hooks such as
// PowerSGD chain further allreduces on the first one's future) takes the
// scope of the operation it follows, wherever it runs: on compcoll's worker,
// on an inner backend's thread, or at once on the thread attaching it once
// the operation has completed. So every rank decides alike for the same
// call, whatever the timing, as long as its ranks attach their callbacks
// alike (DDP's hooks attach them as they issue the operation).
//
// Python can open the same scope on a thread (compcoll.gradient_scope()):
// for gradient sums issued outside a backward pass, such as the allreduces
// by which a rank that has joined under DDP's Join shadows the backward
// passes of the ranks still training. Its peers issue theirs in backward,
// so it must decide as they do, or the ranks take different routes.
// The scope also says which backward pass a call belongs to (autograd's
// graph task), for the error-feedback keys (buffer_slots.h): tensors freed
// right after their allreduce (compiled autograd's per-parameter
// allreduces, say) are told apart by the pass they share.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>

namespace compcoll::torch_integration {

// A thread's scope, as work and callbacks carry it: kOutside, kUnknownPass
// (in backward, pass unknown: compcoll.gradient_scope()), or a backward
// pass's id + kFirstPass.
using Scope = int64_t;
inline constexpr Scope kOutside = 0;
inline constexpr Scope kUnknownPass = 1;
inline constexpr Scope kFirstPass = 2;

// The scope an operation the calling thread issues now takes: inherited
// (see InheritedScope) or autograd's.
Scope current_scope();

// The model an operation is issued for, where compcoll knows it, else 0.
// compcoll's wrapper of DDP comm hooks (compcoll/_ddp_hooks.py) gives each
// registered hook an owner of its own, for the operations the hook issues
// and their callbacks. The error-feedback keys never give one owner's slot
// to another owner's buffer (buffer_slots.h): without it, two models whose
// hooks reduce fresh tensors of one shape (fp16_compress_hook on two DDP
// models of one architecture) in backward passes of their own would take
// turns on one slot, each carrying the other's residual into its gradient.
uint64_t current_owner();

// An owner with this bit set is a hook that compresses gradients itself
// (PowerSGD: low-rank factors with an error feedback of its own). What it
// issues, and its callbacks, take the exact route under every
// COMPCOLL_TORCH_SCOPE: sparsifying its factors zeroes whole columns, and
// PowerSGD's orthogonalization then divides 0 by 0 (NaN from the next step
// on). compcoll/_ddp_hooks.py sets it.
inline constexpr uint64_t kSelfCompressingOwner = uint64_t{1} << 62;
inline bool owner_compresses_itself(uint64_t owner) {
  return (owner & kSelfCompressingOwner) != 0;
}

// What an operation carries to its callbacks, taken when it is issued.
struct IssueContext {
  Scope scope = kOutside;
  uint64_t owner = 0;
};
IssueContext current_context();

// True when an operation the calling thread issues now is in a backward
// pass (or inherits one, see InheritedScope).
bool issued_in_backward();

// The backward pass an operation issued now belongs to, 0 when it is
// outside backward or its pass is unknown; the same id for every operation
// of one pass, on any thread, and another id for every pass.
uint64_t backward_pass();

// While alive, operations issued by this thread take `context`: set around
// the completion of a compcoll work, whose future runs callbacks.
class InheritedScope {
 public:
  explicit InheritedScope(const IssueContext& context);
  ~InheritedScope();
  InheritedScope(const InheritedScope&) = delete;
  InheritedScope& operator=(const InheritedScope&) = delete;

 private:
  Scope saved_scope_;
  uint64_t saved_owner_;
};

// A delegated operation the caller issued straight to Gloo (the worker
// idle) returns Gloo's work: its future's callbacks run on Gloo's thread, or
// at once on the thread attaching them when it has already completed, and
// which one depends on timing, so it may differ between ranks. Either way
// they take the scope of the thread that issued the operation: a first
// callback sets it on any other thread that completes the future (where it
// stays until the next such operation sets its own; only callbacks of this
// backend's inner operations run there).
void pass_scope_to_callbacks(const c10::intrusive_ptr<c10d::Work>& work);

// An allreduce issued in a backward pass that sums activations or their
// gradients rather than parameters' gradients, found by the autograd node
// this thread is evaluating: a built-in operation's node (its saved
// tensors being recomputed by torch.utils.checkpoint, whose forward, with
// any allreduce in it, then runs inside that node), or one of torch's
// Functions whose backward recomputes (reentrant checkpoint) or allreduces
// an activation's gradient (torch.distributed.nn.functional.all_reduce).
// Returns that node's name, or "" where the call may be a gradient sum:
// outside backward, in a parameter's gradient accumulation (AccumulateGrad:
// DDP's, FSDP's and Horovod-style hooks), in the backward's final
// callbacks, in a Function of the script's own (FSDP2's post-backward is
// one; mark_tensor_parallel says when a group's are activations), on a
// callback's thread, or in gradient_scope(). Every rank runs the same
// program, so every rank judges a call alike.
std::string activations_node();

// compcoll.gradient_scope(): enter returns what exit restores, so scopes nest.
Scope enter_gradient_scope();
void exit_gradient_scope(Scope saved);
// What this thread issues is values, not gradient sums, even inside a
// backward pass: exact under every COMPCOLL_TORCH_SCOPE. Two kinds, for the
// stats' reason and the notes: SyncBatchNorm's batch statistics
// (compcoll._sync_batchnorm) and activation checkpointing's recomputation
// of a forward (compcoll._activation_checkpoint: the node it runs in may be any, a
// Function of the script's own too). enter returns what exit restores.
enum class ValuesKind : int { kNone = 0, kBatchStatistics = 1, kRecomputation = 2 };
int enter_values_scope(int kind);
void exit_values_scope(int saved);
bool in_values_scope();
ValuesKind values_kind();

// Around a DDP comm hook's call (compcoll/_ddp_hooks.py): the same nesting.
uint64_t enter_owner(uint64_t owner);
void exit_owner(uint64_t saved);

}  // namespace compcoll::torch_integration
