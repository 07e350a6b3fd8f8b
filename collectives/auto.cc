#include "collectives/auto.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "collectives/dense.h"
#include "collectives/onebit_allreduce.h"
#include "collectives/self_comm.h"
#include "collectives/sparse_allreduce.h"
#include "collectives/sparse_scatter.h"
#include "compcoll/error.h"

namespace compcoll {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median of `reps` timings of fn, agreed across ranks (MAX per sample).
template <typename Fn>
double agreed_median(Comm& comm, int reps, Fn&& fn) {
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t[i] = seconds_since(t0);
  }
  comm.allreduce(t.data(), t.size(), DType::kFloat64, ReduceOp::kMax);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The sizes the compressed algorithm's compute is timed at: the large one in
// the memory-bound regime yet cheap (it is also the link probe's), the small
// one the default COMPCOLL_MIN_ELEMS, where a call's fixed costs show.
constexpr size_t kCalibrationElements = size_t{1} << 20;
constexpr size_t kCalibrationSmallElements = size_t{1} << 14;

// Predictions closer than this factor are not trusted: measure instead.
constexpr double kTrialBand = 2.0;
// A size's chosen path is re-timed this often (its link may change).
constexpr uint64_t kRetimeEvery = 64;

double median(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best of three one-rank calls of m elements, on a state past any warm-up:
// the warm-up's densities (or csc's and onebit's exact steps) would time
// another algorithm than the one that runs for the rest of training, and
// since a warm-up advances only on compressed calls, judging a tensor by
// its warm-up could keep it dense, and in its warm-up, for good.
double time_one_rank_call(const Algorithm& algo, size_t m) {
  std::vector<float> g(m), work(m);
  for (size_t i = 0; i < m; ++i) g[i] = std::sin(0.37 * double(i)) * (1.0 + (i % 17));
  auto scratch = algo.make_state(m, 1);
  scratch->steps = uint64_t{1} << 31;  // warm-up steps are an int
  SelfComm self;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    std::copy(g.begin(), g.end(), work.begin());
    const auto t0 = Clock::now();
    algo.allreduce(self, work.data(), m, false, *scratch);
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

}  // namespace

AutoAllreduce::AutoAllreduce(std::unique_ptr<Algorithm> compressed)
    : compressed_(std::move(compressed)) {
  CC_CHECK(compressed_ != nullptr && std::string(compressed_->name()) != "auto" &&
               std::string(compressed_->name()) != "dense",
           kInvalidArgument, "auto needs a compressed algorithm to choose against dense");
}

std::unique_ptr<CodecState> AutoAllreduce::make_state(size_t n, int world_size) const {
  return compressed_->make_state(n, world_size);
}

CostShape AutoAllreduce::cost_shape(size_t n, int world_size) const {
  return last_compressed_ ? compressed_->cost_shape(n, world_size)
                          : CostShape{double(ring_allreduce_bytes(n * 4, world_size)), 0, true};
}

LinkModel measure_link(Comm& comm) {
  LinkModel link;
  if (comm.size() == 1) return link;  // no network
  // alpha_ring: a ring allreduce small enough that its bytes cost nothing,
  // but with data in every segment. Gloo's ring cuts the buffer into at
  // least 2P segments and skips the empty ones, so one float moves a single
  // segment along the ring, one message in flight at a time; a ring with
  // data (dense's, csc's) makes every rank send and receive at each of its
  // 2(P-1) steps, and that is what a call pays per ring (docs/scaling.md).
  std::vector<float> ring(2 * size_t(comm.size()), 0.0f);
  link.alpha_ring = agreed_median(comm, 9, [&] {
    comm.allreduce(ring.data(), ring.size(), DType::kFloat32, ReduceOp::kSum);
  });
  const uint64_t token = 0;
  link.alpha = agreed_median(comm, 9, [&] {
    comm.allgatherv({reinterpret_cast<const uint8_t*>(&token), sizeof token}, sizeof token);
  });  // one round: from the second call on, the token travels with its size
  std::vector<float> probe(kCalibrationElements, 1.0f);
  const double t_big = agreed_median(comm, 3, [&] {
    comm.allreduce(probe.data(), probe.size(), DType::kFloat32, ReduceOp::kSum);
  });
  const double bytes = double(ring_allreduce_bytes(probe.size() * 4, comm.size()));
  link.beta = std::max(1e-12, (t_big - link.alpha_ring) / bytes);
  return link;
}

LinkModel assumed_link() { return {100e-6, 50e-6, 8.0 / 10e9}; }

double predict_seconds(const CostShape& c, const LinkModel& link) {
  return (c.ring_allreduce ? link.alpha_ring : link.alpha) * c.rounds + c.wire_bytes * link.beta;
}

CostShape sparse_pattern_cost(SparsePattern pattern, size_t n, int world_size, double density,
                              double bytes_per_entry) {
  const double peers = world_size - 1;
  const double k = double(target_count(density, n));
  constexpr double kAnnounce = 8;                           // a size, per peer and round
  constexpr double kHeader = kPayloadHeaderBytes + 4;       // header (+ sbc's mean)
  switch (pattern) {
    case SparsePattern::kAllgather:
      // One round: the size travels with the payload (GlooComm's eager
      // allgatherv, once a call of about this size has set the bound).
      return {peers * (kAnnounce + kHeader + k * bytes_per_entry), 1, false};
    case SparsePattern::kScatter: {
      const double b = double(scatter_owner_budget(size_t(k), world_size));
      // Every part to an owner starts with the sender's regions tag.
      const double to_owners = peers / world_size * k * bytes_per_entry + peers * kScatterTagBytes;
      // Each owner's part carries its 8-byte demand count too.
      const double from_owner = peers * (b * bytes_per_entry + kScatterDemandBytes);
      // The alltoallv to the owners and the allgatherv of their results:
      // one round each (the sizes travel with the parts).
      return {to_owners + from_owner + 2 * peers * (kAnnounce + kHeader), 2, false};
    }
    case SparsePattern::kAuto: break;
  }
  CC_THROW(kInternal, "sparse_pattern_cost needs allgather or scatter, not ", sparse_pattern_name(pattern));
}

SparsePattern choose_sparse_pattern(const LinkModel& link, size_t n, int world_size,
                                    double density, double bytes_per_entry) {
  if (world_size <= 2) return SparsePattern::kAllgather;
  const double gather = predict_seconds(
      sparse_pattern_cost(SparsePattern::kAllgather, n, world_size, density, bytes_per_entry), link);
  const double scatter = predict_seconds(
      sparse_pattern_cost(SparsePattern::kScatter, n, world_size, density, bytes_per_entry), link);
  return scatter < gather ? SparsePattern::kScatter : SparsePattern::kAllgather;
}

void AutoAllreduce::attach(Comm& comm) {
  attach_with_link(measure_link(comm));  // all zeros on one rank: no network, dense is free
}

void AutoAllreduce::attach_with_link(const LinkModel& link) {
  attached_ = true;
  link_ = link;
  // A sparse algorithm choosing its pattern uses the same measurement
  // instead of probing the link a second time.
  if (auto* sparse = dynamic_cast<SparseAllreduce*>(compressed_.get())) sparse->set_link(link_);
}

void AutoAllreduce::calibrate(Comm& comm) const {
  // Two sizes, whatever the first call's: fitted to one size, a small first
  // call made its fixed costs look like a per-element cost 3-4x the real one
  // for every larger tensor.
  const double t_small = time_one_rank_call(*compressed_, kCalibrationSmallElements);
  const double t_large = time_one_rank_call(*compressed_, kCalibrationElements);
  double fit[2];
  fit[1] = std::max(0.0, (t_large - t_small) /
                             double(kCalibrationElements - kCalibrationSmallElements));
  fit[0] = std::max(0.0, t_small - fit[1] * double(kCalibrationSmallElements));
  // The slowest rank's, term by term: every rank compresses, and a call
  // waits for the last.
  comm.allreduce(fit, 2, DType::kFloat64, ReduceOp::kMax);
  speed_ = {fit[0], fit[1]};
  calibrated_ = true;
}

void AutoAllreduce::assume_codec_speed(const CodecSpeed& speed) const {
  speed_ = speed;
  calibrated_ = true;
}

double AutoAllreduce::predict_dense(size_t n, int world_size) const {
  if (world_size == 1) return 0.0;
  return link_.alpha_ring + double(ring_allreduce_bytes(n * 4, world_size)) * link_.beta;
}

double AutoAllreduce::predict_compressed(size_t n, int world_size) const {
  const CostShape c = compressed_->cost_shape(n, world_size);
  const double latency = c.ring_allreduce ? c.rounds * link_.alpha_ring : c.rounds * link_.alpha;
  return speed_.fixed_s + speed_.per_element_s * double(n) + latency + c.wire_bytes * link_.beta;
}

CallInfo AutoAllreduce::allreduce(Comm& comm, float* buf, size_t n, bool average,
                                  CodecState& state) const {
  return run(comm, buf, n, average, state, false);
}

CallInfo AutoAllreduce::allreduce_listing_support(Comm& comm, float* buf, size_t n, bool average,
                                                  CodecState& state) const {
  return run(comm, buf, n, average, state, true);
}

CallInfo AutoAllreduce::run(Comm& comm, float* buf, size_t n, bool average, CodecState& state,
                            bool list_support) const {
  CC_CHECK(attached_, kInternal, "auto used before attach() measured the link");
  ++calls_;
  // One rank has no link to save: dense is free and nothing is timed.
  const bool retime = calls_ == kRecalibrateFirst || calls_ % kRecalibrateEvery == 0;
  if (comm.size() > 1 && (!calibrated_ || retime)) calibrate(comm);
  const double td = predict_dense(n, comm.size());
  const double tc = predict_compressed(n, comm.size());
  Trial& trial = trial_of(n);
  ++trial.calls;
  const bool sure = comm.size() == 1 || tc * kTrialBand < td || td * kTrialBand < tc;
  const char* why = "by the cost model";
  bool timed = false;
  if (sure) {
    last_compressed_ = tc < td;
  } else if (trial.compressed_s.size() < kTrialSamples) {
    // Alternate, dense first, until both paths have their samples.
    last_compressed_ = trial.dense_s.size() > trial.compressed_s.size();
    timed = true;
    why = "timing both paths";
  } else {
    last_compressed_ = median(trial.compressed_s) < median(trial.dense_s);
    timed = trial.calls % kRetimeEvery == 0;
    why = "by the timings";
  }
  last_decision_ = describe_decision(why, td, tc, trial);

  const auto t0 = Clock::now();
  CallInfo info;
  if (!last_compressed_) {
    info = run_dense(comm, buf, n, average, state);
  } else if (list_support) {
    info = compressed_->allreduce_listing_support(comm, buf, n, average, state);
  } else {
    info = compressed_->allreduce(comm, buf, n, average, state);
  }
  if (timed) {
    double t = seconds_since(t0);
    comm.allreduce(&t, 1, DType::kFloat64, ReduceOp::kMax);  // the same number everywhere
    auto& samples = last_compressed_ ? trial.compressed_s : trial.dense_s;
    if (samples.size() >= kTrialSamples) samples.erase(samples.begin());  // keep the newest
    samples.push_back(t);
  }
  return info;
}

AutoAllreduce::Trial& AutoAllreduce::trial_of(size_t n) const {
  auto it = trials_.find(n);
  if (it == trials_.end()) {
    if (trials_.size() >= kMaxTimedSizes) {
      const auto oldest = std::min_element(
          trials_.begin(), trials_.end(),
          [](const auto& a, const auto& b) { return a.second.last_call < b.second.last_call; });
      trials_.erase(oldest);
    }
    it = trials_.emplace(n, Trial{}).first;
  }
  it->second.last_call = calls_;
  return it->second;
}

std::string AutoAllreduce::describe_decision(const char* why, double td, double tc,
                                             const Trial& trial) const {
  const char* name = compressed_->name();
  auto ms = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
    return std::string(text);
  };
  std::string text = std::string(last_compressed_ ? name : "dense") + " (" + why +
                     "; predicted " + ms(td) + " dense, " + ms(tc) + " " + name;
  // Only what was timed: a size the model is sure about is never timed, and
  // a placeholder would read as a measurement.
  if (!trial.dense_s.empty()) text += "; measured " + ms(median(trial.dense_s)) + " dense";
  if (!trial.compressed_s.empty()) {
    text += (trial.dense_s.empty() ? "; measured " : ", ") + ms(median(trial.compressed_s)) + " " +
            name;
  }
  return text + ")";
}

CallInfo AutoAllreduce::run_dense(Comm& comm, float* buf, size_t n, bool average,
                                  CodecState& state) const {
  // Whatever the residual holds goes out with this call, so switching loses
  // nothing. onebit's server error is the error of this rank's shard of the
  // sum: it joins the same elements of this rank's contribution.
  for (size_t i = 0; i < std::min(n, state.v.size()); ++i) buf[i] += state.v[i];
  std::fill(state.v.begin(), state.v.end(), 0.0f);
  if (const auto* onebit = dynamic_cast<const OneBitAllreduce*>(compressed_.get())) {
    const auto shard = onebit->shard(n, comm.size(), comm.rank());
    for (size_t i = 0; i < shard.len && i < state.u.size(); ++i) buf[shard.begin + i] += state.u[i];
    std::fill(state.u.begin(), state.u.end(), 0.0f);
  }
  dense_allreduce(comm, buf, n, DType::kFloat32, average ? ReduceOp::kAvg : ReduceOp::kSum);
  return {ring_allreduce_bytes(n * sizeof(float), comm.size()), n};
}

}  // namespace compcoll
