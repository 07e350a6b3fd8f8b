#include "integration/pytorch/csrc/issue_scope.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/node.h>

#include <cstring>
#include <exception>
#include <thread>
#include <typeinfo>

namespace compcoll::torch_integration {
namespace {

// -1: nothing inherited (ask autograd); else a callback's inherited Scope.
thread_local Scope inherited_scope = -1;
// The owner of what this thread issues (see current_owner): set around a
// wrapped comm hook, or inherited by a callback.
thread_local uint64_t thread_owner = 0;
// enter_values_scope: this thread issues values (ValuesKind).
thread_local int values_scope = 0;

}  // namespace

Scope current_scope() {
  if (inherited_scope >= 0) return inherited_scope;
  // Graph task ids count up from 0, one per backward() call.
  const int64_t task = torch::autograd::get_current_graph_task_id();
  return task < 0 ? kOutside : task + kFirstPass;
}

std::string activations_node() {
  if (inherited_scope >= 0) return {};  // a callback's, or gradient_scope()
  const auto node = torch::autograd::get_current_node();
  if (!node || dynamic_cast<torch::autograd::AccumulateGrad*>(node.get()) != nullptr) return {};
  // PyNode (a Python Function's node) by its type's name: its type info is
  // not exported from libtorch_python for a dynamic_cast here.
  const torch::autograd::Node& n = *node;
  if (std::strcmp(typeid(n).name(), "N5torch8autograd6PyNodeE") != 0) return node->name();
  // A Python Function's backward: the script's own may sum gradients; these
  // of torch's do not.
  std::string name = node->name();  // takes the GIL
  if (name == "CheckpointFunctionBackward" || name == "_AllReduceBackward") return name;
  return {};
}

uint64_t current_owner() { return thread_owner; }

IssueContext current_context() { return {current_scope(), thread_owner}; }

bool issued_in_backward() { return current_scope() != kOutside; }

uint64_t backward_pass() {
  const Scope s = current_scope();
  return s >= kFirstPass ? static_cast<uint64_t>(s - kFirstPass + 1) : 0;
}

InheritedScope::InheritedScope(const IssueContext& context)
    : saved_scope_(inherited_scope), saved_owner_(thread_owner) {
  inherited_scope = context.scope;
  thread_owner = context.owner;
}

InheritedScope::~InheritedScope() {
  inherited_scope = saved_scope_;
  thread_owner = saved_owner_;
}

void pass_scope_to_callbacks(const c10::intrusive_ptr<c10d::Work>& work) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const std::exception&) {
    return;  // Gloo's send/recv works have no future, so no callbacks
  }
  if (!future) return;
  const IssueContext context = current_context();
  const std::thread::id issuer = std::this_thread::get_id();
  future->addCallback([context, issuer](c10::ivalue::Future&) {
    if (std::this_thread::get_id() == issuer) return;
    inherited_scope = context.scope;
    thread_owner = context.owner;
  });
}

Scope enter_gradient_scope() {
  const Scope saved = inherited_scope;
  inherited_scope = kUnknownPass;
  return saved;
}

void exit_gradient_scope(Scope saved) { inherited_scope = saved; }

int enter_values_scope(int kind) {
  const int saved = values_scope;
  values_scope = kind == static_cast<int>(ValuesKind::kRecomputation)
                     ? kind
                     : static_cast<int>(ValuesKind::kBatchStatistics);
  return saved;
}

void exit_values_scope(int saved) { values_scope = saved; }

ValuesKind values_kind() { return static_cast<ValuesKind>(values_scope); }

bool in_values_scope() { return values_scope != 0; }

uint64_t enter_owner(uint64_t owner) {
  const uint64_t saved = thread_owner;
  thread_owner = owner;
  return saved;
}

void exit_owner(uint64_t saved) { thread_owner = saved; }

}  // namespace compcoll::torch_integration
