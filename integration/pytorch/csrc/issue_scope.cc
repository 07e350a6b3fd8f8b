#include "integration/pytorch/csrc/issue_scope.h"

#include <torch/csrc/autograd/graph_task.h>

#include <exception>
#include <thread>

namespace compcoll::torch_integration {
namespace {

// -1: nothing inherited (ask autograd); else a callback's inherited Scope.
thread_local Scope inherited_scope = -1;

}  // namespace

Scope current_scope() {
  if (inherited_scope >= 0) return inherited_scope;
  // Graph task ids count up from 0, one per backward() call.
  const int64_t task = torch::autograd::get_current_graph_task_id();
  return task < 0 ? kOutside : task + kFirstPass;
}

bool issued_in_backward() { return current_scope() != kOutside; }

uint64_t backward_pass() {
  const Scope s = current_scope();
  return s >= kFirstPass ? static_cast<uint64_t>(s - kFirstPass + 1) : 0;
}

InheritedScope::InheritedScope(Scope scope) : saved_(inherited_scope) { inherited_scope = scope; }

InheritedScope::~InheritedScope() { inherited_scope = saved_; }

void pass_scope_to_callbacks(const c10::intrusive_ptr<c10d::Work>& work) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const std::exception&) {
    return;  // Gloo's send/recv works have no future, so no callbacks
  }
  if (!future) return;
  const Scope scope = current_scope();
  const std::thread::id issuer = std::this_thread::get_id();
  future->addCallback([scope, issuer](c10::ivalue::Future&) {
    if (std::this_thread::get_id() != issuer) inherited_scope = scope;
  });
}

Scope enter_gradient_scope() {
  const Scope saved = inherited_scope;
  inherited_scope = kUnknownPass;
  return saved;
}

void exit_gradient_scope(Scope saved) { inherited_scope = saved; }

}  // namespace compcoll::torch_integration
