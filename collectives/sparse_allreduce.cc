#include "collectives/sparse_allreduce.h"

#include <cstdio>

#include "collectives/sparse_allgather.h"
#include "collectives/sparse_scatter.h"
#include "compcoll/error.h"

namespace compcoll {

SparseAllreduce::SparseAllreduce(const char* name, std::unique_ptr<SparseCodec> codec,
                                 double density, double bytes_per_entry, SparsePattern pattern,
                                 SparseEncoding encoding)
    : name_(name),
      codec_(std::move(codec)),
      density_(density),
      bytes_per_entry_(bytes_per_entry),
      pattern_(pattern),
      encoding_(encoding) {
  CC_CHECK(codec_ != nullptr, kInternal, name_, ": no codec");
  CC_CHECK(std::string(name_) != "sbc" || pattern_ != SparsePattern::kScatter, kInvalidArgument,
           kSbcRefusesScatter);
  if (std::string(name_) == "sbc") pattern_ = SparsePattern::kAllgather;  // auto: its only pattern
}

std::unique_ptr<CodecState> SparseAllreduce::make_state(size_t n, int) const {
  return codec_->make_state(n);
}

void SparseAllreduce::attach(Comm& comm) {
  // Only auto needs the link, and only where scatter can win at all.
  if (pattern_ == SparsePattern::kAuto && comm.size() > 2 && !link_known_) set_link(measure_link(comm));
}

void SparseAllreduce::take_attachment(const Algorithm& before) {
  const auto* b = dynamic_cast<const SparseAllreduce*>(&before.unwrapped());
  if (b != nullptr && b->link_known_) set_link(b->link_);
}

SparsePattern SparseAllreduce::pattern_for(size_t n, int world_size) const {
  if (pattern_ != SparsePattern::kAuto) return pattern_;
  return choose_sparse_pattern(link_, n, world_size, density_, bytes_per_entry_);
}

CallInfo SparseAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                    CodecState& state) const {
  return run(comm, buf, n, average, state, false);
}

CallInfo SparseAllreduce::allreduce_listing_support(Comm& comm, float* buf, size_t n,
                                                    bool average, CodecState& state) const {
  return run(comm, buf, n, average, state, true);
}

CallInfo SparseAllreduce::allreduce_host_sum(Comm& comm, float* buf, const Addends& addends,
                                             size_t n, bool average, CodecState& state) const {
  return run(comm, buf, n, average, state, true, addends);
}

CallInfo SparseAllreduce::run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
                              bool list_support, const Addends& addends) const {
  const SparsePattern p = pattern_for(n, comm.size());
  if (pattern_ == SparsePattern::kAuto) {
    char text[200];
    if (!link_known_ && comm.size() <= 2) {
      // attach() measures no link where scatter cannot win: no prediction.
      std::snprintf(text, sizeof text,
                    "%s (auto: at %d ranks scatter cannot send less; the link is not measured)",
                    sparse_pattern_name(p), comm.size());
    } else {
      // The cost model's time of each pattern's exchange on the wire (link
      // latency and bandwidth), not of the whole call: the codecs' time is
      // the same in both.
      std::snprintf(
          text, sizeof text, "%s (auto: predicted exchange %.3f ms allgather, %.3f ms scatter%s)",
          sparse_pattern_name(p),
          predict_seconds(sparse_pattern_cost(SparsePattern::kAllgather, n, comm.size(), density_,
                                              bytes_per_entry_), link_) * 1e3,
          predict_seconds(sparse_pattern_cost(SparsePattern::kScatter, n, comm.size(), density_,
                                              bytes_per_entry_), link_) * 1e3,
          link_known_ ? "" : " on an assumed link");
    }
    std::lock_guard<std::mutex> lock(decision_mutex_);
    last_decision_ = text;
  }
  if (p == SparsePattern::kScatter) {
    return sparse_scatter(comm, name_, *codec_, encoding_, buf, n, average, state, list_support,
                          addends);
  }
  return sparse_allgather(comm, name_, *codec_, buf, n, average, state, list_support, addends);
}

CostShape SparseAllreduce::cost_shape(size_t n, int world_size) const {
  return sparse_pattern_cost(pattern_for(n, world_size), n, world_size, density_, bytes_per_entry_);
}

}  // namespace compcoll
