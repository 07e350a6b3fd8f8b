#include "integration/pytorch/csrc/deferred_release.h"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace compcoll::torch_integration {
namespace {

struct Kept {
  std::mutex mu;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
};

// Never destroyed: a static's destructor would drop what is left after the
// interpreter is gone.
Kept& kept_works() {
  static Kept* k = new Kept;
  return *k;
}

}  // namespace

void DeferredRelease::keep(c10::intrusive_ptr<c10d::Work> work) {
  if (!work) return;
  Kept& k = kept_works();
  std::lock_guard<std::mutex> lock(k.mu);
  k.works.push_back(std::move(work));
}

void DeferredRelease::release_unshared() {
  // A dropped work may hold the last other reference to a kept one (a
  // compcoll work holds its inner work): round after round until a round
  // frees nothing, at most once per work kept at the start.
  Kept& k = kept_works();
  for (size_t rounds = kept(); rounds > 0; --rounds) {
    std::vector<c10::intrusive_ptr<c10d::Work>> unshared;
    {
      std::lock_guard<std::mutex> lock(k.mu);
      // use_count() == 1: only this list holds it, and nobody can take a
      // new reference from nothing, so it stays 1 until dropped below.
      auto last = std::stable_partition(k.works.begin(), k.works.end(),
                                        [](const auto& w) { return w.use_count() > 1; });
      unshared.assign(std::make_move_iterator(last), std::make_move_iterator(k.works.end()));
      k.works.erase(last, k.works.end());
    }
    if (unshared.empty()) return;
    // Dropped here, outside the lock: a drop may take the GIL.
  }
}

size_t DeferredRelease::release_at_exit(std::chrono::milliseconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    release_unshared();
    if (kept() == 0) return 0;
    if (std::chrono::steady_clock::now() >= until) break;
    // An inner thread lets go of a completed work microseconds after it
    // completes; a Python object that holds one lets go only in the
    // interpreter's own teardown, which this bound does not wait for.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Kept& k = kept_works();
  std::lock_guard<std::mutex> lock(k.mu);
  const size_t leaked = k.works.size();
  for (auto& w : k.works) (void)w.release();  // never dropped: never frees
  k.works.clear();
  return leaked;
}

size_t DeferredRelease::kept() {
  Kept& k = kept_works();
  std::lock_guard<std::mutex> lock(k.mu);
  return k.works.size();
}

}  // namespace compcoll::torch_integration
