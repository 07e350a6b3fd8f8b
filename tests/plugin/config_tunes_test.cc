// Which algorithms read which variable (ConfigVar::tunes): the messages a
// communicator prints for a variable its algorithm does not read, and the
// table's claims checked against the algorithms themselves, so that "changes
// nothing" is never said of a variable that changes something.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "collectives/registry.h"
#include "collectives/self_comm.h"
#include "compcoll/error.h"
#include "plugin/config.h"
#include "tests/plugin/env_of.h"

namespace compcoll {
namespace {

std::vector<std::string> inert(std::map<std::string, std::string> vars) {
  const EnvLookup env = env_of(std::move(vars));
  return inert_settings(load_config(env), env);
}

TEST(InertSettings, AVariableOfAnotherAlgorithmIsNamedWithWhatItTunes) {
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_DENSITY", "0.01"}}),
            std::vector<std::string>{"COMPCOLL_DENSITY=0.01 changes nothing for COMPCOLL_ALGO=onebit "
                                     "(it tunes dgc, sbc, sdagc)"});
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_CLIP", "1"}}),
            std::vector<std::string>{"COMPCOLL_CLIP=1 changes nothing for COMPCOLL_ALGO=sbc "
                                     "(it tunes dgc, sdagc)"});
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_AUTO_ALGO", "sdagc"}}),
            std::vector<std::string>{"COMPCOLL_AUTO_ALGO=sdagc changes nothing for "
                                     "COMPCOLL_ALGO=dgc (it tunes auto)"});
}

TEST(InertSettings, VariablesTheAlgorithmReadsAndCommunicatorSettingsAreNotReported) {
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"},
                     {"COMPCOLL_DENSITY", "0.01"},
                     {"COMPCOLL_CLIP", "1"},
                     {"COMPCOLL_MIN_ELEMS", "1"},
                     {"COMPCOLL_HIERARCHY", "off"},
                     {"COMPCOLL_TIMEOUT_MS", "5000"},
                     {"COMPCOLL_DEBUG", "INFO"},
                     {"COMPCOLL_STATS_FILE", "/tmp/s-{rank}.json"}})
                  .empty());
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_ONEBIT_BLOCK", "64"},
                     {"COMPCOLL_WARMUP_STEPS", "0"}})
                  .empty());
  // An empty value counts as unset, as load_config reads it.
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_DENSITY", ""}}).empty());
}

TEST(InertSettings, AWarmUpShapeWithoutAWarmUpIsNamed) {
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_STEPS", "0"},
                   {"COMPCOLL_WARMUP_SHAPE", "stages"}}),
            std::vector<std::string>{"COMPCOLL_WARMUP_SHAPE=stages changes nothing with "
                                     "COMPCOLL_WARMUP_STEPS=0: there is no warm-up to shape"});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_SHAPE", "stages"}}).empty());
}

// sbc sends dgc's entries over its exact warm-up only; its binarised steps
// have no values and code their positions their own way.
TEST(InertSettings, AnEntryEncodingForSbcWithoutItsExactWarmUpIsNamed) {
  const std::string why =
      " changes nothing for sbc without its exact warm-up (COMPCOLL_SBC_WARMUP=binary or "
      "COMPCOLL_WARMUP_STEPS=0): its binarised steps send positions and one mean per side";
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_SBC_WARMUP", "binary"},
                   {"COMPCOLL_VALUE_DTYPE", "fp16"}}),
            std::vector<std::string>{"COMPCOLL_VALUE_DTYPE=fp16" + why});
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "sbc"},
                   {"COMPCOLL_WARMUP_STEPS", "0"}, {"COMPCOLL_INDEX_CODING", "u32"}}),
            std::vector<std::string>{"COMPCOLL_INDEX_CODING=u32" + why});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_VALUE_DTYPE", "fp16"},
                     {"COMPCOLL_INDEX_CODING", "u32"}})
                  .empty());
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SBC_WARMUP", "binary"},
                     {"COMPCOLL_VALUE_DTYPE", "fp16"}})
                  .size() == 1);  // only COMPCOLL_SBC_WARMUP, which dgc does not read
}

TEST(InertSettings, AutoReadsItsOwnVariablesAndItsAlgorithms) {
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "csc"},
                     {"COMPCOLL_CSC_CHUNK", "1024"}})
                  .empty());
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_DENSITY", "0.01"}}).empty());  // dgc
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_CSC_CHUNK", "1024"}}),
            std::vector<std::string>{"COMPCOLL_CSC_CHUNK=1024 changes nothing for "
                                     "COMPCOLL_ALGO=auto with COMPCOLL_AUTO_ALGO=dgc (it tunes csc)"});
}

TEST(InertSettings, WithoutCompressionEveryAlgorithmVariableIsInert) {
  const auto m = inert({{"COMPCOLL_DENSITY", "0.01"}, {"COMPCOLL_MIN_ELEMS", "1"},
                        {"COMPCOLL_TIMEOUT_MS", "5000"}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], "COMPCOLL_DENSITY=0.01 changes nothing while COMPCOLL_ALGO is dense or unset: "
                  "nothing is compressed (it tunes dgc, sbc, sdagc)");
  EXPECT_EQ(m[1], "COMPCOLL_MIN_ELEMS=1 changes nothing while COMPCOLL_ALGO is dense or unset: "
                  "nothing is compressed");
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dense"}, {"COMPCOLL_HIERARCHY", "host"}}).size(), 1u);
}

TEST(InertSettings, EveryListedNameIsARegisteredAlgorithm) {
  for (const ConfigVar& v : config_table()) {
    for (const std::string_view name : tuned_algorithms(v)) {
      EXPECT_NO_THROW(find_algorithm(name)) << v.name << " lists '" << name << "'";
      EXPECT_NE(name, "dense") << v.name;
    }
  }
}

// A value other than the default for every variable that some algorithms
// read and others do not.
const std::map<std::string, std::string> kOtherValue = {
    {"COMPCOLL_DENSITY", "0.05"},
    {"COMPCOLL_MOMENTUM", "0.9"},
    {"COMPCOLL_NESTEROV", "1"},
    {"COMPCOLL_MOMENTUM_MASKING_DENSITY", "0"},
    {"COMPCOLL_MOMENTUM_HANDOVER", "0"},
    {"COMPCOLL_CLIP", "0.001"},
    {"COMPCOLL_WARMUP_STEPS", "0"},
    {"COMPCOLL_WARMUP_SHAPE", "stages"},
    {"COMPCOLL_SBC_WARMUP", "binary"},
    {"COMPCOLL_SBC_SIDES", "one"},
    {"COMPCOLL_SELECTION", "normalized"},
    {"COMPCOLL_CSC_CHUNK", "1024"},
    {"COMPCOLL_CSC_FRACTION", "0.5"},
    {"COMPCOLL_ONEBIT_BLOCK", "64"},
    {"COMPCOLL_ONEBIT_SCALE", "pair"},
    {"COMPCOLL_ONEBIT_RESIDUAL_BOUND", "0"},
    {"COMPCOLL_VALUE_DTYPE", "fp16"},
    {"COMPCOLL_INDEX_CODING", "u32"},
    {"COMPCOLL_SAMPLE_FRACTION", "0.5"},
    {"COMPCOLL_SPARSE_PATTERN", "scatter"},
    {"COMPCOLL_AUTO_ALGO", "sdagc"},
};

// Six calls of `algo` on one rank, the first two in the warm-up (the runs
// below set COMPCOLL_WARMUP_STEPS=2): the output bits of every call.
std::vector<float> run_calls(const std::string& algo, const AlgoParams& params) {
  constexpr size_t kN = 20000;
  SelfComm comm;
  auto a = make_algorithm(algo, params);
  a->attach(comm);
  auto state = a->make_state(kN, 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> out;
  for (int call = 0; call < 6; ++call) {
    std::vector<float> buf(kN);
    for (float& x : buf) x = g(rng);
    a->allreduce(comm, buf.data(), kN, false, *state);
    out.insert(out.end(), buf.begin(), buf.end());
  }
  return out;
}

// auto is left out: it measures the machine, so two runs need not agree.
TEST(InertSettings, AVariableAnAlgorithmDoesNotReadLeavesItsResultsBitForBit) {
  const std::vector<std::string> algos = {"dgc", "sbc", "sdagc", "csc", "onebit"};
  ASSERT_EQ(kOtherValue.size(), [] {
    size_t listed = 0;
    for (const ConfigVar& v : config_table()) {
      listed += *v.tunes && std::strcmp(v.tunes, kTunesCompressed) != 0;
    }
    return listed;
  }()) << "every variable with a list of algorithms needs another value here";
  size_t checked = 0;
  for (const std::string& algo : algos) {
    const std::map<std::string, std::string> base_env = {{"COMPCOLL_ALGO", algo},
                                                          {"COMPCOLL_WARMUP_STEPS", "2"}};
    const Config base = load_config(env_of(base_env));
    const std::vector<float> expected = run_calls(algo, base.params);
    for (const auto& [name, value] : kOtherValue) {
      std::map<std::string, std::string> vars = base_env;
      vars[name] = value;
      const EnvLookup env = env_of(vars);
      const Config changed = load_config(env);
      if (inert_settings(changed, env).empty()) continue;  // the algorithm reads it
      std::vector<float> got;
      try {
        got = run_calls(algo, changed.params);
      } catch (const Error& e) {
        ADD_FAILURE() << name << "=" << value << " is said to change nothing for " << algo
                      << " but makes it fail: " << e.what();
        continue;
      }
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
          << name << "=" << value << " is said to change nothing for " << algo
          << ", but its results differ";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40u);
}

}  // namespace
}  // namespace compcoll
