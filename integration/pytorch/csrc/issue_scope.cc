#include "integration/pytorch/csrc/issue_scope.h"

#include <torch/csrc/autograd/graph_task.h>

#include <exception>
#include <thread>

namespace compcoll::torch_integration {
namespace {

// -1: nothing inherited (ask autograd); 0 or 1: a callback's inherited scope.
thread_local int inherited_scope = -1;

}  // namespace

bool issued_in_backward() {
  if (inherited_scope >= 0) return inherited_scope == 1;
  return torch::autograd::get_current_graph_task_id() != -1;
}

InheritedScope::InheritedScope(bool in_backward) : saved_(inherited_scope) {
  inherited_scope = in_backward ? 1 : 0;
}

InheritedScope::~InheritedScope() { inherited_scope = saved_; }

void pass_scope_to_callbacks(const c10::intrusive_ptr<c10d::Work>& work) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const std::exception&) {
    return;  // Gloo's send/recv works have no future, so no callbacks
  }
  if (!future) return;
  const int scope = issued_in_backward() ? 1 : 0;
  const std::thread::id issuer = std::this_thread::get_id();
  future->addCallback([scope, issuer](c10::ivalue::Future&) {
    if (std::this_thread::get_id() != issuer) inherited_scope = scope;
  });
}

int enter_gradient_scope() {
  const int saved = inherited_scope;
  inherited_scope = 1;
  return saved;
}

void exit_gradient_scope(int saved) { inherited_scope = saved; }

}  // namespace compcoll::torch_integration
