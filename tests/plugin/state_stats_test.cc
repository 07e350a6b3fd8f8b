#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "plugin/state_store.h"
#include "plugin/stats.h"

namespace compcoll {
namespace {

TEST(StateStore, KeysByExplicitKeyOrByAddressCountAndDtype) {
  StateStore store(100);
  StateStore::Got got = StateStore::Got::kExisting;
  auto make = [] { return std::make_unique<CodecState>(10); };
  StateKey a{"", 0x1000, 10, DType::kFloat32};
  CodecState& s1 = store.get(a, 10, make, &got);
  EXPECT_EQ(got, StateStore::Got::kNew);
  s1.v[3] = 7.0f;
  CodecState& s2 = store.get(a, 10, make, &got);
  EXPECT_EQ(got, StateStore::Got::kExisting);
  EXPECT_EQ(s2.v[3], 7.0f);
  store.get({"", 0x1000, 10, DType::kFloat16}, 10, make, &got);
  EXPECT_EQ(got, StateStore::Got::kNew);  // another dtype is another tensor
  store.get({"bucket0", 0x2000, 10, DType::kFloat32}, 10, make, &got);
  EXPECT_EQ(got, StateStore::Got::kNew);
  store.get({"bucket0", 0x3000, 10, DType::kFloat32}, 10, make, &got);
  EXPECT_EQ(got, StateStore::Got::kExisting);  // an explicit key survives a buffer move
  store.get({"bucket0", 0x3000, 12, DType::kFloat32}, 12, make, &got);
  EXPECT_EQ(got, StateStore::Got::kReplaced);  // another size: another tensor under the key
  EXPECT_EQ(store.entries(), 3u);
  EXPECT_EQ(store.memory_bytes(), 3 * 10 * sizeof(float));
}

TEST(StateStore, EvictsEntriesUnusedForManyCallsThatUseIt) {
  StateStore store(3);
  StateStore::Got got = StateStore::Got::kExisting;
  auto make = [] { return std::make_unique<CodecState>(4); };
  store.get({"old", 0, 4, DType::kFloat32}, 4, make, &got).v[2] = -1.5f;  // not sent yet
  store.get({"spent", 0, 4, DType::kFloat32}, 4, make, &got);            // all zero
  EXPECT_EQ(store.tick().entries, 0u);
  // Calls that do not use the store (the dense route's) do not age it.
  for (int i = 0; i < 50; ++i) EXPECT_EQ(store.tick().entries, 0u);
  EXPECT_EQ(store.entries(), 2u);
  for (int i = 0; i < 2; ++i) {
    store.get({"hot", 0, 4, DType::kFloat32}, 4, make, &got);
    EXPECT_EQ(store.tick().entries, 0u);
  }
  store.get({"hot", 0, 4, DType::kFloat32}, 4, make, &got);
  const StateStore::Evicted evicted = store.tick();  // unused for 4 calls
  EXPECT_EQ(evicted.entries, 2u);
  EXPECT_EQ(evicted.holding, 1u);  // "spent" held nothing
  EXPECT_DOUBLE_EQ(evicted.residual_l1, 1.5);
  EXPECT_EQ(evicted.keys, std::vector<std::string>{"key:old"});
  EXPECT_EQ(store.entries(), 1u);
}

// A restored entry that a call of another size meets first is kept aside
// and comes back at its own size (DDP's initial bucket, then the rebuilt
// one); restored entries evicted before any call used them are counted, the
// kept-aside ones included.
TEST(StateStore, KeepsARestoredEntryAsideForItsSizeAndCountsTheOnesDroppedUnused) {
  StateStore store(3);
  StateStore::Got got = StateStore::Got::kExisting;
  auto make4 = [] { return std::make_unique<CodecState>(4); };
  auto make6 = [] { return std::make_unique<CodecState>(6); };
  const StateKey used{"used", 0, 4, DType::kFloat32}, resized{"resized", 0, 4, DType::kFloat32},
      idle{"idle", 0, 4, DType::kFloat32};
  for (const StateKey* k : {&used, &resized, &idle}) {
    auto s = std::make_unique<CodecState>(4);
    s->v[0] = 7.0f;  // what a fresh entry does not hold
    store.put(k->str(), std::move(s), 0);
    EXPECT_TRUE(store.restored_unclaimed(*k));
  }
  EXPECT_EQ(store.get(used, 4, make4, &got).v[0], 7.0f);
  EXPECT_EQ(got, StateStore::Got::kExisting);
  EXPECT_FALSE(store.restored_unclaimed(used));
  // Another size first: a fresh entry, the restored one aside ...
  EXPECT_EQ(store.get(resized, 6, make6, &got).v[0], 0.0f);
  EXPECT_EQ(got, StateStore::Got::kKeptAside);
  EXPECT_EQ(store.memory_bytes(), (4 + 6 + 4 + 4) * sizeof(float));
  // ... which a checkpoint taken now saves in the key's place: the state the
  // run restored, not the one the call of another size made.
  size_t saved_resized = 0;
  for (const StateStore::Saved& e : store.saved()) {
    if (*e.key == resized.str()) {
      ++saved_resized;
      EXPECT_EQ(e.state->size(), 4u);
      EXPECT_EQ(e.state->v[0], 7.0f);
    }
  }
  EXPECT_EQ(saved_resized, 1u);
  // ... and back at its own size.
  EXPECT_EQ(store.get(resized, 4, make4, &got).v[0], 7.0f);
  EXPECT_EQ(got, StateStore::Got::kBackFromAside);
  EXPECT_EQ(store.restored_dropped(), 0u);
  // Aside once more, then never used: evicted and counted, as "idle" is.
  store.put(resized.str(), std::make_unique<CodecState>(4), 0);
  store.get(resized, 6, make6, &got);
  for (int i = 0; i < 5; ++i) {
    store.get(used, 4, make4, &got);
    store.get(resized, 6, make6, &got);
    store.tick();
  }
  EXPECT_EQ(store.entries(), 2u);
  EXPECT_EQ(store.restored_dropped(), 2u);  // "idle" and the aside "resized"
  // One that was idle long in the checkpointed run would have been evicted
  // there too: not awaited, and not counted when it goes.
  const StateKey old{"old", 0, 4, DType::kFloat32};
  store.put(old.str(), std::make_unique<CodecState>(4), StateStore::kRecentlyUsedCalls + 1);
  EXPECT_FALSE(store.restored_unclaimed(old));
  for (int i = 0; i < 5; ++i) {
    store.get(used, 4, make4, &got);
    store.tick();
  }
  EXPECT_EQ(store.find(old), nullptr);  // gone
  EXPECT_EQ(store.restored_dropped(), 2u);
}

TEST(Stats, AccumulatesAndWritesJsonWithTheRankInThePath) {
  Stats s;
  s.record({true, 4000, 40, 1.5});
  s.record({false, 100, 100, 0.5});
  EXPECT_EQ(s.calls(), 2u);
  EXPECT_EQ(s.compressed_calls(), 1u);
  EXPECT_DOUBLE_EQ(s.ratio(), 4100.0 / 140.0);
  EXPECT_EQ(stats_path("/tmp/s-{rank}-{rank}.json", 3), "/tmp/s-3-3.json");
  const std::string path = testing::TempDir() + "stats-test.json";
  ASSERT_TRUE(write_file_atomically(path, s.json(3, 4, "dgc", 123)));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  for (const char* field : {"\"calls\": 2", "\"compressed_calls\": 1", "\"dense_bytes\": 4100",
                            "\"wire_bytes\": 140", "\"ratio\": ", "\"algo\": \"dgc\"", "\"rank\": 3"}) {
    EXPECT_NE(text.str().find(field), std::string::npos) << field << " in " << text.str();
  }
  std::remove(path.c_str());
}

// The steady ratio leaves out the calls made while their tensor warmed up:
// a short job's whole-run ratio is mostly warm-up, its steady one is what
// the algorithm sends afterwards. Both are in the JSON and the summary.
TEST(Stats, SteadyRatioCountsOnlyTheCallsAfterTheWarmUp) {
  Stats s;
  CallRecord warm{true, 4000, 1000, 1.0};
  warm.in_warmup = true;
  s.record(warm);
  s.record(warm);
  EXPECT_EQ(s.steady_calls(), 0u);
  EXPECT_EQ(s.steady_ratio(), 0.0);
  EXPECT_EQ(s.summary("dgc").find("after the warm-up"), std::string::npos);
  s.record({true, 4000, 40, 1.0});
  s.record({false, 100, 100, 1.0});  // a dense route after it: part of the steady state
  EXPECT_EQ(s.steady_calls(), 2u);
  EXPECT_DOUBLE_EQ(s.steady_ratio(), 4100.0 / 140.0);
  EXPECT_DOUBLE_EQ(s.ratio(), 12100.0 / 2140.0);
  const std::string json = s.json(0, 4, "dgc", 0);
  EXPECT_NE(json.find("\"steady_calls\": 2, \"steady_ratio\": 29.2857"), std::string::npos) << json;
  EXPECT_NE(s.summary("dgc").find("ratio 5.7x (29.3x after the warm-up)"), std::string::npos)
      << s.summary("dgc");
}

// last_density shows what the warm-up decided: the share of its elements the
// last compressed call sent (dense calls and onebit's dense warm-up, which
// are not compressed calls, leave it alone).
TEST(Stats, LastDensityIsTheShareTheLastCompressedCallSent) {
  Stats s;
  EXPECT_NE(s.json(0, 4, "dgc", 0).find("\"last_density\": 0,"), std::string::npos);
  s.record({true, 4000, 40, 1.0, 100000, 25000});  // warm-up stage 1: 25 %
  s.record({false, 400, 400, 1.0, 10000, 10000});  // a small tensor, dense
  EXPECT_NE(s.json(0, 4, "dgc", 0).find("\"last_density\": 0.25,"), std::string::npos);
  s.record({true, 4000, 4, 1.0, 100000, 100});
  EXPECT_NE(s.json(0, 4, "dgc", 0).find("\"last_density\": 0.001,"), std::string::npos)
      << s.json(0, 4, "dgc", 0);
}

}  // namespace
}  // namespace compcoll
