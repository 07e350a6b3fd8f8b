// The sparse allreduce algorithms (dgc, sdagc, sbc): a sparsifying codec and
// the pattern that moves its payloads (COMPCOLL_SPARSE_PATTERN):
//   allgather  every rank receives every payload (sparse_allgather.h)
//   scatter    index-region owners reduce and re-select, an allgatherv
//              returns the result; O(k) per rank (sparse_scatter.h)
//   auto       per call, the one auto.h's cost model predicts faster for
//              this P, k and link. attach() measures the link (collective,
//              agreed: every rank takes the same pattern); `auto`
//              (AutoAllreduce) hands over its own measurement instead.
//              Without either, assumed_link() stands in.
// sbc runs allgather only: its payload is one sign's positions and one
// mean, and an owner's sum of several ranks' means is no longer binary (see
// docs/scaling.md), so a scatter request for sbc is refused at construction.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "collectives/algorithm.h"
#include "collectives/auto.h"
#include "compression/sparse_payload.h"

namespace compcoll {

// Why sbc refuses the scatter pattern: said by the algorithm and, before any
// call, by the configuration (plugin/config.cc), so compcoll-info agrees.
inline constexpr char kSbcRefusesScatter[] =
    "COMPCOLL_SPARSE_PATTERN=scatter: sbc cannot use the scatter pattern (an owner's sum of "
    "several ranks' binarised means is not binary; see docs/scaling.md); use allgather or auto, "
    "or dgc/sdagc";

class SparseAllreduce final : public Algorithm {
 public:
  // bytes_per_entry and density describe the payloads for the cost model;
  // encoding is how the scatter pattern re-encodes the owners' results.
  SparseAllreduce(const char* name, std::unique_ptr<SparseCodec> codec, double density,
                  double bytes_per_entry, SparsePattern pattern, SparseEncoding encoding);
  const char* name() const override { return name_; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  // Lists the support: the payloads' indices (allgather) or the owners'
  // kept indices (scatter).
  CallInfo allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const override;
  // The codec adds the addends in its encode pass where it can (dgc without
  // clipping or normalized selection: SparseCodec::fuses_addends).
  CallInfo allreduce_host_sum(Comm& comm, float* buf, const Addends& addends, size_t n,
                              bool average, CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;
  void attach(Comm& comm) override;
  void take_attachment(const Algorithm& before) override;
  std::string last_decision() const override {
    std::lock_guard<std::mutex> lock(decision_mutex_);
    return last_decision_;
  }

  // The link the auto pattern weighs the patterns on (auto.cc passes its own).
  void set_link(const LinkModel& link) {
    link_ = link;
    link_known_ = true;
  }
  // The pattern an n-element call on world_size ranks takes.
  SparsePattern pattern_for(size_t n, int world_size) const;
  SparsePattern configured_pattern() const { return pattern_; }

 private:
  CallInfo run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
               bool list_support, const Addends& addends = {}) const;

  const char* name_;
  std::unique_ptr<SparseCodec> codec_;
  double density_;
  double bytes_per_entry_;
  SparsePattern pattern_;
  SparseEncoding encoding_;
  LinkModel link_ = assumed_link();
  bool link_known_ = false;
  // allreduce is const and so may run on several threads at once (one
  // algorithm object serving ranks as threads); the decision text is its
  // only write.
  mutable std::mutex decision_mutex_;
  mutable std::string last_decision_;
};

}  // namespace compcoll
