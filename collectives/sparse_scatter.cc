#include "collectives/sparse_scatter.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>

#include "collectives/owner_rejection.h"
#include "collectives/sparse_allgather.h"
#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/payload.h"

namespace compcoll {
namespace {

using u128 = unsigned __int128;

// Step 6's mass: 7/8 demand, 1/8 index length, in units of 2^-40 of the
// whole (fine enough for 2^32 indices; 7 * 2^40 * 2^64 still fits 128 bits).
constexpr u128 kMassUnit = u128{1} << 40;

struct Entry {
  uint32_t idx;
  float value;
};

// Owner step 3: per-index sums of the received entries (appended in rank
// order; the stable sort keeps that order inside each index).
std::vector<Entry> sum_by_index(std::vector<Entry> received) {
  std::stable_sort(received.begin(), received.end(),
                   [](const Entry& a, const Entry& b) { return a.idx < b.idx; });
  std::vector<Entry> sums;
  for (const Entry& e : received) {
    if (!sums.empty() && sums.back().idx == e.idx) {
      sums.back().value += e.value;
    } else {
      sums.push_back(e);
    }
  }
  return sums;
}

// Owner step 3: every non-finite sum, and the `budget` largest finite
// non-zero sums by magnitude (ties: lower index); returned in index order.
std::vector<Entry> select_owned(std::vector<Entry> sums, size_t budget) {
  std::vector<Entry> keep, finite;
  for (const Entry& e : sums) {
    if (!std::isfinite(e.value)) {
      keep.push_back(e);
    } else if (e.value != 0.0f) {
      finite.push_back(e);
    }
  }
  if (finite.size() > budget) {
    std::nth_element(finite.begin(), finite.begin() + budget, finite.end(),
                     [](const Entry& a, const Entry& b) {
                       const float ma = std::fabs(a.value), mb = std::fabs(b.value);
                       return ma != mb ? ma > mb : a.idx < b.idx;
                     });
    finite.resize(budget);
  }
  keep.insert(keep.end(), finite.begin(), finite.end());
  std::sort(keep.begin(), keep.end(), [](const Entry& a, const Entry& b) { return a.idx < b.idx; });
  return keep;
}

// An owner's part of step 4, parsed and checked against its region.
struct OwnerResult {
  uint64_t demand = 0;
  SparseEntries entries;
};

OwnerResult parse_owner_result(std::span<const uint8_t> part, size_t len, int world_size) {
  OwnerResult r;
  if (part.empty()) return r;  // nothing received, nothing selected
  CC_PAYLOAD_CHECK(part.size() >= kScatterDemandBytes, "owner result of ", part.size(),
                   " bytes has no room for its ", kScatterDemandBytes, "-byte demand");
  r.demand = load_le<uint64_t>(part.data());
  CC_PAYLOAD_CHECK(r.demand <= uint64_t(world_size) * len, "owner claims ", r.demand,
                   " received entries for a region of ", len, " elements and ", world_size, " ranks");
  r.entries = decode_sparse(part.subspan(kScatterDemandBytes), len);
  for (size_t i = 1; i < r.entries.idx.size(); ++i) {
    CC_PAYLOAD_CHECK(r.entries.idx[i - 1] < r.entries.idx[i], "owner result indices ",
                     r.entries.idx[i - 1], " and ", r.entries.idx[i], " at entry ", i,
                     " are not strictly increasing");
  }
  return r;
}

// FNV-1a over the boundaries: equal on two ranks when their regions are.
uint64_t regions_tag(const std::vector<size_t>& regions) {
  uint64_t h = 1469598103934665603ull;
  for (const size_t b : regions) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (uint64_t(b) >> (8 * byte)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

size_t scatter_owner_budget(size_t k, int world_size) {
  const size_t p = static_cast<size_t>(std::max(world_size, 1));
  return (kScatterBudgetFactor * k + p - 1) / p;
}

std::vector<size_t> equal_regions(size_t n, int world_size) {
  std::vector<size_t> r(static_cast<size_t>(world_size) + 1);
  for (size_t j = 0; j < r.size(); ++j) r[j] = size_t(u128(n) * j / size_t(world_size));
  return r;
}

bool valid_regions(std::span<const size_t> r, size_t n, int world_size) {
  if (r.size() != static_cast<size_t>(world_size) + 1 || r.front() != 0 || r.back() != n) return false;
  return std::is_sorted(r.begin(), r.end());
}

std::vector<size_t> rebalanced_regions(std::span<const size_t> regions,
                                       std::span<const uint64_t> demand,
                                       std::span<const std::vector<uint32_t>> selected) {
  const size_t p = demand.size();
  CC_CHECK(regions.size() == p + 1 && selected.size() == p, kInternal,
           "regions, demand and selections disagree on the rank count");
  std::vector<size_t> next(regions.begin(), regions.end());
  u128 total_demand = 0;
  for (uint64_t d : demand) total_demand += d;
  const size_t n = regions.back();
  if (total_demand == 0 || n == 0) return next;
  // The demand mass: on the owners' selected indices (where the sums were
  // largest), or spread over the region when an owner selected nothing.
  std::vector<size_t> at;      // global indices of the selected entries, increasing
  std::vector<u128> at_cum;    // mass of entries [0, i]
  std::vector<u128> spread(p), spread_before(p + 1, 0);
  for (size_t j = 0; j < p; ++j) {
    const u128 mass = 7 * kMassUnit * demand[j] / total_demand;
    if (selected[j].empty()) {
      spread[j] = mass;
    } else {
      const u128 each = mass / selected[j].size();
      for (uint32_t i : selected[j]) {
        at.push_back(regions[j] + i);
        at_cum.push_back((at_cum.empty() ? 0 : at_cum.back()) + each);
      }
    }
    spread_before[j + 1] = spread_before[j] + spread[j];
  }
  // mass(x): the mass of indices [0, x); non-decreasing in x.
  const auto mass = [&](size_t x) {
    u128 m = kMassUnit * x / n;
    const size_t c = size_t(std::lower_bound(at.begin(), at.end(), x) - at.begin());
    if (c > 0) m += at_cum[c - 1];
    // The region holding x (the last one starting at or before it).
    const size_t r = std::min(p - 1, size_t(std::upper_bound(regions.begin(), regions.end(), x) -
                                            regions.begin()) - 1);
    m += spread_before[r];
    const size_t len = regions[r + 1] - regions[r];
    if (len > 0) m += spread[r] * (std::min(x, regions[r + 1]) - regions[r]) / len;
    return m;
  };
  const u128 total = mass(n);
  for (size_t j = 1; j < p; ++j) {
    const u128 target = total * j / p;
    size_t lo = next[j - 1], hi = n;  // the first x with mass(x) >= target
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (mass(mid) >= target) hi = mid;
      else lo = mid + 1;
    }
    next[j] = lo;
  }
  return next;
}

CallInfo sparse_scatter(Comm& comm, const char* name, const SparseCodec& codec,
                        SparseEncoding encoding, float* buf, size_t n, bool average,
                        CodecState& state, bool list_support, const Addends& addends) {
  const int world = comm.size(), me = comm.rank();
  const size_t p = static_cast<size_t>(world);
  if (!valid_regions(state.regions, n, world)) state.regions = equal_regions(n, world);
  const std::vector<size_t> regions = state.regions;  // this call's; step 6 replaces the state's
  size_t widest = 0;
  for (size_t j = 0; j < p; ++j) widest = std::max(widest, regions[j + 1] - regions[j]);
  const size_t max_part = max_payload_bytes(widest);

  // 1. select.
  Bytes payload;
  const EncodeInfo info = encode_with_addends(codec, buf, addends, n, state, payload);
  const SparseEntries mine = decode_sparse(payload, n);  // indices increasing, < n
  std::vector<size_t> cut(p + 1);  // mine's entries of region j: [cut[j], cut[j+1])
  for (size_t j = 0; j <= p; ++j) {
    cut[j] = size_t(std::lower_bound(mine.idx.begin(), mine.idx.end(), regions[j]) - mine.idx.begin());
  }
  cut[p] = mine.idx.size();

  // 2. scatter. Every part starts with this rank's regions tag.
  const uint64_t tag = regions_tag(regions);
  std::vector<Bytes> to_owner(p);
  size_t sent_bytes = 0;
  std::vector<uint32_t> rel;
  std::vector<float> values;
  Bytes body;
  for (size_t j = 0; j < p; ++j) {
    to_owner[j].resize(kScatterTagBytes);
    store_le<uint64_t>(to_owner[j].data(), tag);
    if (cut[j] != cut[j + 1]) {
      rel.clear();
      for (size_t t = cut[j]; t < cut[j + 1]; ++t) rel.push_back(uint32_t(mine.idx[t] - regions[j]));
      values.assign(mine.values.begin() + cut[j], mine.values.begin() + cut[j + 1]);
      // The values are already what a receiver decodes: re-encoding is exact.
      encode_sparse(rel, values, regions[j + 1] - regions[j], encoding, body);
      to_owner[j].insert(to_owner[j].end(), body.begin(), body.end());
    }
    if (j != size_t(me)) sent_bytes += to_owner[j].size();
  }
  const std::vector<Bytes> received = comm.alltoallv(to_owner, kScatterTagBytes + max_part);
  CC_CHECK_EQ(received.size(), p, kInternal, "alltoallv returned the wrong number of parts");

  // Regions live in each rank's state. If two ranks' states for this tensor
  // have not seen the same calls, they cut the index space differently and
  // every entry would land in the wrong place. Every rank has every other
  // rank's tag now, so if any two differ, every rank stops here, with the
  // same cause, before decoding anything; what it selected goes back into
  // its residual (nothing is lost).
  for (int r = 0; r < world; ++r) {
    const Bytes& part = received[size_t(r)];
    if (part.size() >= kScatterTagBytes && load_le<uint64_t>(part.data()) == tag) continue;
    if (part.size() < kScatterTagBytes) {
      reject_peer_payload(name, comm, r, Error(ErrorKind::kMalformedPayload,
          detail::concat("a scatter part of ", part.size(), " bytes has no regions tag")));
    }
    for (size_t t = 0; t < mine.idx.size(); ++t) {
      if (std::isfinite(mine.values[t])) state.v[mine.idx[t]] += mine.values[t];
    }
    CC_CHECK(false, kMismatch, name, ": rank ", me, " and rank ", r,
             " used different index regions for this tensor in the scatter pattern: their "
             "error-feedback states for it have not seen the same calls (under PyTorch: a tensor "
             "reallocated while the previous one was still referenced can get a different slot "
             "on each rank). Reduce a buffer that is reused call after call, or set "
             "COMPCOLL_SPARSE_PATTERN=allgather");
  }

  // 3. reduce (this rank as the owner of region `me`).
  const size_t base = regions[size_t(me)], len = regions[size_t(me) + 1] - base;
  std::vector<Entry> incoming;
  // A part refused here is known to this rank alone: it still joins the
  // gather, with a marker instead of its result (owner_rejection.h).
  std::exception_ptr refused;
  Bytes result;
  for (int r = 0; r < world && !refused; ++r) {
    const Bytes& part = received[size_t(r)];
    if (part.size() == kScatterTagBytes) continue;  // no entries for this owner
    SparseEntries e;
    try {
      e = decode_sparse(std::span<const uint8_t>(part).subspan(kScatterTagBytes), len);
    } catch (const Error& err) {
      try {
        reject_peer_payload(name, comm, r, err);
      } catch (...) {
        refused = std::current_exception();
        result = rejection_marker(r);
      }
    }
    for (size_t t = 0; t < e.idx.size(); ++t) incoming.push_back({e.idx[t], e.values[t]});
  }
  const uint64_t demand = refused ? 0 : incoming.size();
  const std::vector<Entry> chosen =
      refused ? std::vector<Entry>{}
              : select_owned(sum_by_index(std::move(incoming)), scatter_owner_budget(info.wanted, world));
  if (demand > 0) {
    rel.resize(chosen.size());
    values.resize(chosen.size());
    for (size_t t = 0; t < chosen.size(); ++t) rel[t] = chosen[t].idx, values[t] = chosen[t].value;
    Bytes body;
    encode_sparse(rel, values, len, encoding, body);  // values now hold what travels
    // Its rounding (chosen - values) goes into this owner's residual once the
    // gather shows no owner refused a part (below): a call that stops there
    // puts back what each rank selected, whole.
    result.resize(kScatterDemandBytes + body.size());
    store_le<uint64_t>(result.data(), demand);
    std::copy(body.begin(), body.end(), result.begin() + kScatterDemandBytes);
  }

  // 4. gather, zeroing buf (encoded in step 1) while the results travel.
  const Gathered all = comm.allgatherv_overlapping(result, kScatterDemandBytes + max_part,
                                                   [&] { std::fill(buf, buf + n, 0.0f); });
  CC_CHECK_EQ(all.parts(), world, kInternal, "allgatherv returned the wrong number of parts");
  sent_bytes += result.size();
  // An owner refused a part: every rank stops here alike, before using any
  // result, and what it selected goes back into its residual.
  for (int j = 0; j < world; ++j) {
    const std::optional<int> sender = rejected_sender(all.part(j));
    if (!sender) continue;
    for (size_t t = 0; t < mine.idx.size(); ++t) {
      if (std::isfinite(mine.values[t])) state.v[mine.idx[t]] += mine.values[t];
    }
    if (refused) std::rethrow_exception(refused);
    throw_owner_rejection(name, comm, j, *sender);
  }
  for (size_t t = 0; t < chosen.size(); ++t) {
    if (std::isfinite(chosen[t].value) && std::isfinite(values[t])) {
      state.v[base + chosen[t].idx] += chosen[t].value - values[t];
    }
  }
  std::vector<uint64_t> demands(p);
  std::vector<std::vector<uint32_t>> selections(p);
  CallInfo call;
  if (list_support) call.support.emplace();
  for (size_t j = 0; j < p; ++j) {
    OwnerResult owner;
    try {
      owner = parse_owner_result(all.part(int(j)), regions[j + 1] - regions[j], world);
    } catch (const Error& err) {
      reject_peer_payload(name, comm, int(j), err);
    }
    demands[j] = owner.demand;
    const auto& sel = owner.entries.idx;
    for (size_t t = 0; t < sel.size(); ++t) buf[regions[j] + sel[t]] = owner.entries.values[t];
    if (call.support) {
      for (const uint32_t i : sel) call.support->push_back(static_cast<uint32_t>(regions[j] + i));
    }
    // 5. return: what this rank sent to owner j and j did not select.
    size_t s = 0;
    for (size_t t = cut[j]; t < cut[j + 1]; ++t) {
      const uint32_t i = uint32_t(mine.idx[t] - regions[j]);
      while (s < sel.size() && sel[s] < i) ++s;
      if ((s == sel.size() || sel[s] != i) && std::isfinite(mine.values[t])) {
        state.v[mine.idx[t]] += mine.values[t];
      }
    }
    selections[j] = std::move(owner.entries.idx);
  }

  // 6. balance.
  state.regions = rebalanced_regions(regions, demands, selections);
  if (average) scale_in_place(buf, n, world);
  call.payload_bytes = sent_bytes;
  call.selected = info.sent;
  return call;
}

}  // namespace compcoll
