// `auto`: compress only when it is predicted to be faster, and say why.
//
// Terms:
//   alpha_ring  latency of a small dense (ring) allreduce
//   alpha       latency of one point-to-point round (half a tiny allgatherv)
//   beta        seconds per byte a rank sends, from a 4 MiB dense allreduce
//   c0, c       the compressed algorithm's compute per call and per element
//               (CodecSpeed): its encode, selection and decode timed on a
//               one-rank communicator at two sizes, past any warm-up, at the
//               first call and again at the kRecalibrateFirst-th and every
//               kRecalibrateEvery-th call (a load spike at the first call,
//               data loaders starting say, must not decide for good)
// Predictions for an n-element call on R ranks:
//   dense       alpha_ring + 2 (R-1)/R * 4n * beta
//   compressed  c0 + c * n + rounds * alpha + wire_bytes * beta   (cost_shape())
// The link is measured in attach() (collective); every measurement is
// agreed with an allreduce MAX, so every rank makes the same choice.
// Where the model is not sure (the two predictions within kTrialBand of each
// other) auto measures instead: the first 2 * kTrialSamples calls of that
// size alternate dense and compressed, each timed and agreed across ranks,
// and later calls of that size take the path with the lower median,
// re-timing it every kRetimeEvery calls. When a
// tensor goes dense, its residual is added to the call first: nothing is
// lost by switching.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"

namespace compcoll {

// The compressed algorithm's compute: fixed_s + per_element_s * n seconds.
struct CodecSpeed {
  double fixed_s = 0.0;
  double per_element_s = 0.0;
};

// When auto times the compressed algorithm's compute again, counted in its
// calls (of any size; every rank counts the same calls).
constexpr uint64_t kRecalibrateFirst = 32;
constexpr uint64_t kRecalibrateEvery = 4096;
// How many sizes auto remembers timings of. A job whose sizes keep changing
// (dynamic shapes) would otherwise grow the table without end; past the
// bound the size called least recently is forgotten (and timed again should
// it come back). Every rank sees the same calls, so forgets the same size.
constexpr size_t kMaxTimedSizes = 1024;
// Timed calls per path before auto trusts the comparison.
constexpr size_t kTrialSamples = 3;
// Calls of one size until auto's choice for it is settled (its trials and
// the first call that takes the choice): what a benchmark leaves untimed.
constexpr size_t kCallsUntilSettled = 2 * kTrialSamples + 1;

struct LinkModel {
  double alpha_ring = 0.0;  // seconds
  double alpha = 0.0;       // seconds per point-to-point round
  double beta = 0.0;        // seconds per byte
};

// Measures the link as described above. Collective; every value is agreed
// (allreduce MAX), so every rank holds the same model. A one-rank
// communicator has no link: all zeros.
LinkModel measure_link(Comm& comm);

// What an algorithm uses before (or without) a measurement: rounds of
// 50 us and 10 Gbit/s, a LAN of today. Only the sparse pattern choice reads
// it, and only when nobody called attach().
LinkModel assumed_link();

// Seconds the communication of one call takes: rounds * alpha (alpha_ring
// for a ring allreduce) + wire_bytes * beta.
double predict_seconds(const CostShape& shape, const LinkModel& link);

// The sparse patterns' traffic (COMPCOLL_SPARSE_PATTERN), for the choice
// below, the benchmark's projection and the docs (docs/scaling.md). For an
// n-element call on P ranks at density d, k = target_count(d, n) entries of
// e bytes, h = the payload header (kPayloadHeaderBytes; +4 for sbc's mean) and 8 bytes
// per peer for each size announcement, the bytes ONE rank sends:
//   allgather  (P-1) * (8 + h + k e)                          1 round
//   scatter    (P-1)/P * k e + (P-1) * b e + 2 (P-1)(8 + h)    2 rounds
//              + (P-1) * 8 (each owner's demand count)
//              where b = scatter_owner_budget(k, P) = ceil(2k/P)
// scatter assumes selections spread evenly over the (balanced) regions,
// about 3k(P-1)/P entries; its worst case is (the rank's own selection,
// ~k) e + (P-1) b e + the same headers, still O(k): about 3k entries at
// most, against Ok-Topk's 6k(P-1)/P
// and the lower bound 2k(P-1)/P (see sparse_scatter.h for why 2k/P).
// pattern must be kAllgather or kScatter.
CostShape sparse_pattern_cost(SparsePattern pattern, size_t n, int world_size, double density,
                              double bytes_per_entry);

// The pattern with the lower predicted time on this link; allgather on a
// tie and whenever P <= 2 (scatter then moves as many bytes in more rounds).
SparsePattern choose_sparse_pattern(const LinkModel& link, size_t n, int world_size,
                                    double density, double bytes_per_entry);

class AutoAllreduce final : public Algorithm {
 public:
  explicit AutoAllreduce(std::unique_ptr<Algorithm> compressed);
  const char* name() const override { return "auto"; }
  std::unique_ptr<CodecState> make_state(size_t n, int world_size) const override;
  CallInfo allreduce(Comm& comm, float* buf, size_t n, bool average,
                     CodecState& state) const override;
  // The compressed algorithm's support when it runs; none for dense.
  CallInfo allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                     CodecState& state) const override;
  CostShape cost_shape(size_t n, int world_size) const override;
  void attach(Comm& comm) override;
  // attach() with a link model the caller already has instead of measuring
  // one (not collective; every rank must pass the same model). What auto
  // learnt of the codec's speed and of each size's timings is kept.
  void attach_with_link(const LinkModel& link);
  std::string last_decision() const override { return last_decision_; }

  // The codec speed the predictions use until the next re-timing (tests:
  // a load spike at calibration). Not collective; every rank must pass the
  // same speed.
  void assume_codec_speed(const CodecSpeed& speed) const;
  const CodecSpeed& codec_speed() const { return speed_; }

  // Predicted seconds, for tests and the decision text.
  double predict_dense(size_t n, int world_size) const;
  double predict_compressed(size_t n, int world_size) const;
  const LinkModel& link() const { return link_; }
  const Algorithm& compressed() const { return *compressed_; }
  // Sizes with a timing record (at most kMaxTimedSizes; tests).
  size_t timed_sizes() const { return trials_.size(); }
  bool remembers(size_t n) const { return trials_.count(n) != 0; }

 private:
  CallInfo run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
               bool list_support) const;
  void calibrate(Comm& comm) const;
  CallInfo run_dense(Comm& comm, float* buf, size_t n, bool average, CodecState& state) const;

  std::unique_ptr<Algorithm> compressed_;
  LinkModel link_;
  bool attached_ = false;
  // Measured lazily inside allreduce (which is const for callers).
  mutable CodecSpeed speed_;
  mutable bool calibrated_ = false;
  mutable uint64_t calls_ = 0;  // of every size: when to time the codec again
  mutable bool last_compressed_ = false;
  mutable std::string last_decision_;
  struct Trial {
    std::vector<double> dense_s;  // agreed measured seconds
    std::vector<double> compressed_s;
    uint64_t calls = 0;
    uint64_t last_call = 0;  // calls_ at this size's latest call
  };
  mutable std::map<size_t, Trial> trials_;  // by element count, at most kMaxTimedSizes
  Trial& trial_of(size_t n) const;
  // The line last_decision() returns: the choice, why, and what was predicted
  // and measured for this size.
  std::string describe_decision(const char* why, double td, double tc, const Trial& trial) const;
};

}  // namespace compcoll
