// Which algorithms read which variable (ConfigVar::tunes): the messages a
// communicator prints for a variable its algorithm does not read, and the
// table's claims checked against the algorithms themselves, so that "changes
// nothing" is never said of a variable that changes something.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "collectives/registry.h"
#include "collectives/self_comm.h"
#include "compcoll/error.h"
#include "plugin/config.h"
#include "tests/plugin/env_of.h"

namespace compcoll {
namespace {

std::vector<std::string> inert(std::map<std::string, std::string> vars,
                               FrontEnd front_end = FrontEnd::kStandalone) {
  const EnvLookup env = env_of(std::move(vars));
  Config cfg = load_config(env);
  cfg.front_end = front_end;
  return inert_settings(cfg, env);
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

// compcoll-bench runs several algorithms from one environment: a variable
// is said to change nothing only when none of them reads it.
TEST(InertSettings, ARunOfSeveralAlgorithmsNamesWhatNoneOfThemReads) {
  const EnvLookup env = env_of({{"COMPCOLL_CSC_FRACTION", "0.1"}, {"COMPCOLL_DENSITY", "0.01"},
                                {"COMPCOLL_ONEBIT_BLOCK", "64"}, {"COMPCOLL_ALGO", "sbc"}});
  Config cfg = load_config(env_read_by(FrontEnd::kBenchmark, env));
  cfg.front_end = FrontEnd::kBenchmark;
  EXPECT_EQ(inert_settings_for_algorithms(cfg, {"dense", "dgc", "onebit"}, env),
            (std::vector<std::string>{
                "COMPCOLL_ALGO=sbc changes nothing for compcoll-bench: its rows are the "
                "algorithms of its --algo flag",
                "COMPCOLL_CSC_FRACTION=0.1 changes nothing for this run's algorithms (dense, dgc, "
                "onebit): it tunes csc"}));
  // csc reads its fraction, auto (weighing dgc) the density: only onebit's
  // block, beside COMPCOLL_ALGO, changes nothing.
  const std::vector<std::string> m = inert_settings_for_algorithms(cfg, {"csc", "auto"}, env);
  ASSERT_EQ(m.size(), 2u) << ::testing::PrintToString(m);
  EXPECT_EQ(m[1].rfind("COMPCOLL_ONEBIT_BLOCK=64 changes nothing for this run's algorithms (csc, "
                       "auto)", 0), 0u) << m[1];
}

TEST(InertSettings, AMinimumAboveTheLargestCompressedTensorSaysCompressionIsOff) {
  const std::vector<std::string> m =
      inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_MIN_ELEMS", "5000000000"}});
  ASSERT_EQ(m.size(), 1u);
  EXPECT_NE(m[0].find("every call goes exact: COMPCOLL_ALGO=dgc changes nothing"),
            std::string::npos) << m[0];
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_MIN_ELEMS", "4294967295"}}).empty());
}

TEST(InertSettings, WhatAFrontEndTakesFromItsFrameworkIsNamedForItAlone) {
  const std::map<std::string, std::string> vars = {
      {"COMPCOLL_ALGO", "dgc"},          {"COMPCOLL_TIMEOUT_MS", "5000"},
      {"COMPCOLL_RANK", "1"},            {"COMPCOLL_WORLD_SIZE", "2"},
      {"COMPCOLL_IFACE", "eth0"},        {"COMPCOLL_RENDEZVOUS", "file:///tmp/r"},
      {"COMPCOLL_TORCH_SCOPE", "all"},   {"COMPCOLL_DENSITY", "0.01"}};
  const std::string torch = " changes nothing for the PyTorch backend's groups: ";
  const std::string group_gives =
      "the process group gives the rank, the world size, the store where ranks meet and the Gloo "
      "device (GLOO_SOCKET_IFNAME picks its interface)";
  // Sorted by the table's order: communicator settings, then the timeout.
  EXPECT_EQ(inert(vars, FrontEnd::kTorchBackend),
            (std::vector<std::string>{
                "COMPCOLL_IFACE=eth0" + torch + group_gives,
                "COMPCOLL_RENDEZVOUS=file:///tmp/r" + torch + group_gives,
                "COMPCOLL_RANK=1" + torch + group_gives,
                "COMPCOLL_WORLD_SIZE=2" + torch + group_gives,
                "COMPCOLL_TIMEOUT_MS=5000" + torch +
                    "every operation's limit is the process group's timeout (init_process_group's "
                    "timeout=, torch's default 30 minutes)"}));
  const std::vector<std::string> nccl = inert(vars, FrontEnd::kNcclInterposer);
  ASSERT_EQ(nccl.size(), 5u) << ::testing::PrintToString(nccl);
  EXPECT_EQ(nccl[0].rfind("COMPCOLL_TORCH_SCOPE=all changes nothing for the NCCL interposer's "
                          "communicators: it is the PyTorch backend's: the others have no notion "
                          "of a backward pass",
                          0),
            0u);
  EXPECT_EQ(nccl[1].rfind("COMPCOLL_IFACE=eth0 changes nothing for the NCCL interposer's "
                          "communicators: the NCCL communicator gives the rank",
                          0),
            0u);
  EXPECT_EQ(inert(vars, FrontEnd::kStandalone),
            std::vector<std::string>{"COMPCOLL_TORCH_SCOPE=all changes nothing for the C API: it "
                                     "is the PyTorch backend's: the others have no notion of a "
                                     "backward pass and compress every eligible allreduce"});
  // compcoll-bench starts its ranks and takes its algorithms from its flags.
  const std::vector<std::string> bench = inert(vars, FrontEnd::kBenchmark);
  ASSERT_EQ(bench.size(), 5u) << ::testing::PrintToString(bench);
  EXPECT_EQ(bench[0], "COMPCOLL_ALGO=dgc changes nothing for compcoll-bench: its rows are the "
                      "algorithms of its --algo flag");
  for (const std::string& m : {bench[2], bench[3], bench[4]}) {
    EXPECT_NE(m.find("changes nothing for compcoll-bench: it starts its ranks itself"),
              std::string::npos) << m;
  }
  EXPECT_TRUE(inert(vars, FrontEnd::kAny).empty());  // compcoll-info describes, reads nothing
}

TEST(InertSettings, AWarmUpShapeWithoutAWarmUpIsNamed) {
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_STEPS", "0"},
                   {"COMPCOLL_WARMUP_SHAPE", "stages"}}),
            std::vector<std::string>{"COMPCOLL_WARMUP_SHAPE=stages changes nothing with "
                                     "COMPCOLL_WARMUP_STEPS=0: there is no warm-up to shape"});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_SHAPE", "stages"}}).empty());
  // sbc's choice of what its warm-up sends, likewise.
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_WARMUP_STEPS", "0"},
                   {"COMPCOLL_SBC_WARMUP", "binary"}}),
            std::vector<std::string>{"COMPCOLL_SBC_WARMUP=binary changes nothing with "
                                     "COMPCOLL_WARMUP_STEPS=0: there is no warm-up to shape"});
}

// The normalized selection's encode runs on one thread: threads for it are
// named as changing nothing.
TEST(InertSettings, CodecThreadsUnderTheNormalizedSelectionAreNamed) {
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SELECTION", "normalized"},
                   {"COMPCOLL_CODEC_THREADS", "2"}}),
            std::vector<std::string>{"COMPCOLL_CODEC_THREADS=2 changes nothing with "
                                     "COMPCOLL_SELECTION=normalized: the normalized encode runs "
                                     "on one thread"});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_CODEC_THREADS", "2"}}).empty());
}

// sbc sends dgc's entries over its exact warm-up only; its binarised steps
// have no values, code their positions their own way and rank nothing.
TEST(InertSettings, DgcsEntrySettingsForSbcWithoutItsExactWarmUpAreNamed) {
  const std::string why =
      " changes nothing for sbc without its exact warm-up (COMPCOLL_SBC_WARMUP=binary or "
      "COMPCOLL_WARMUP_STEPS=0): its binarised steps pick by magnitude and send positions and "
      "one mean per side";
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_SBC_WARMUP", "binary"},
                   {"COMPCOLL_VALUE_DTYPE", "fp16"}, {"COMPCOLL_SELECTION", "normalized"}}),
            (std::vector<std::string>{"COMPCOLL_SELECTION=normalized" + why,
                                      "COMPCOLL_VALUE_DTYPE=fp16" + why}));
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "sbc"},
                   {"COMPCOLL_WARMUP_STEPS", "0"}, {"COMPCOLL_INDEX_CODING", "u32"}}),
            std::vector<std::string>{"COMPCOLL_INDEX_CODING=u32" + why});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_VALUE_DTYPE", "fp16"},
                     {"COMPCOLL_INDEX_CODING", "u32"}, {"COMPCOLL_SELECTION", "normalized"}})
                  .empty());
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SBC_WARMUP", "binary"},
                     {"COMPCOLL_VALUE_DTYPE", "fp16"}})
                  .size() == 1);  // only COMPCOLL_SBC_WARMUP, which dgc does not read
}

TEST(InertSettings, MomentumSettingsWithoutAnyMomentumAreNamed) {
  const std::string why =
      " changes nothing with COMPCOLL_MOMENTUM=0 and COMPCOLL_MOMENTUM_HANDOVER=0: there is no "
      "momentum correction";
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "csc"}, {"COMPCOLL_MOMENTUM_HANDOVER", "0"},
                   {"COMPCOLL_NESTEROV", "1"}, {"COMPCOLL_MOMENTUM_MASKING_DENSITY", "0"}}),
            (std::vector<std::string>{"COMPCOLL_NESTEROV=1" + why,
                                      "COMPCOLL_MOMENTUM_MASKING_DENSITY=0" + why}));
  // The optimizer's momentum (handover auto) is corrected where there is an
  // optimizer to take it from: under the PyTorch backend, not elsewhere.
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_NESTEROV", "1"}},
                    FrontEnd::kTorchBackend)
                  .empty());
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_NESTEROV", "1"}}),
            std::vector<std::string>{
                "COMPCOLL_NESTEROV=1 changes nothing with COMPCOLL_MOMENTUM=0 outside the PyTorch "
                "backend (whose groups take the optimizer's momentum): there is no momentum "
                "correction"});
  // compcoll's own momentum is corrected everywhere.
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_MOMENTUM_HANDOVER", "0"},
                     {"COMPCOLL_MOMENTUM", "0.9"}, {"COMPCOLL_NESTEROV", "1"}})
                  .empty());
}

TEST(InertSettings, APatternForSbcIsNamedAndScatterIsRefusedByTheConfiguration) {
  EXPECT_EQ(inert({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_SPARSE_PATTERN", "allgather"}}),
            std::vector<std::string>{"COMPCOLL_SPARSE_PATTERN=allgather changes nothing for sbc: "
                                     "allgather is its only pattern"});
  EXPECT_TRUE(inert({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SPARSE_PATTERN", "allgather"}}).empty());
  // scatter is refused by the configuration itself, so compcoll-info
  // refuses it as the first compressed call would (sbc, or auto over sbc).
  for (const auto& algo : std::vector<std::map<std::string, std::string>>{
           {{"COMPCOLL_ALGO", "sbc"}},
           {{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "sbc"}}}) {
    auto vars = algo;
    vars["COMPCOLL_SPARSE_PATTERN"] = "scatter";
    try {
      load_config(env_of(vars));
      ADD_FAILURE() << "sbc with scatter was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sbc cannot use the scatter pattern"), std::string::npos)
          << e.what();
    }
  }
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
// read and others do not (two where each is inert somewhere else).
const std::multimap<std::string, std::string> kOtherValue = {
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
    {"COMPCOLL_CODEC_THREADS", "3"},
    {"COMPCOLL_DEVICE_CODECS", "on"},
    {"COMPCOLL_SPARSE_PATTERN", "scatter"},
    {"COMPCOLL_SPARSE_PATTERN", "allgather"},
    {"COMPCOLL_AUTO_ALGO", "sdagc"},
    {"COMPCOLL_HOST_ID", "another-host"},
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

const ConfigVar* find_var(const std::string& name) {
  for (const ConfigVar& v : config_table()) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

bool names(const std::vector<std::string>& messages, const std::string& var) {
  for (const std::string& m : messages) {
    if (m.rfind(var + "=", 0) == 0) return true;
  }
  return false;
}

// Every variable said to change nothing, at the defaults and where a
// conditional reader (ConfigVar::idle_because) stops reading: the results
// are bit for bit those without it. auto is left out: it measures the
// machine, so two runs need not agree.
TEST(InertSettings, AVariableAnAlgorithmDoesNotReadLeavesItsResultsBitForBit) {
  const std::vector<std::string> algos = {"dgc", "sbc", "sdagc", "csc", "onebit"};
  ASSERT_EQ(std::set<std::string>([] {
              std::set<std::string> listed;
              for (const ConfigVar& v : config_table()) {
                if (*v.tunes && std::strcmp(v.tunes, kTunesCompressed) != 0) listed.insert(v.name);
                if (*v.tunes && v.idle_because != nullptr) listed.insert(v.name);
              }
              return listed;
            }()),
            [] {
              std::set<std::string> keys;
              for (const auto& kv : kOtherValue) keys.insert(kv.first);
              return keys;
            }())
      << "every variable with a list of algorithms or a condition needs another value here";
  // The runs below set a warm-up of 2 calls (so that warm-up and after are
  // both covered), none, sbc's binary warm-up, no momentum at all, no
  // host hierarchy, or the normalized selection.
  const std::vector<std::map<std::string, std::string>> bases = {
      {{"COMPCOLL_WARMUP_STEPS", "2"}},
      {{"COMPCOLL_WARMUP_STEPS", "0"}},
      {{"COMPCOLL_WARMUP_STEPS", "2"}, {"COMPCOLL_SBC_WARMUP", "binary"}},
      {{"COMPCOLL_WARMUP_STEPS", "2"}, {"COMPCOLL_MOMENTUM_HANDOVER", "0"}},
      {{"COMPCOLL_WARMUP_STEPS", "2"}, {"COMPCOLL_HIERARCHY", "off"}},
      {{"COMPCOLL_WARMUP_STEPS", "2"}, {"COMPCOLL_SELECTION", "normalized"}}};
  std::set<std::string> seen_idle;
  size_t checked = 0;
  for (const std::string& algo : algos) {
    for (std::map<std::string, std::string> base_env : bases) {
      base_env["COMPCOLL_ALGO"] = algo;
      const Config base = load_config(env_of(base_env));
      const std::vector<float> expected = run_calls(algo, base.params);
      for (const auto& [name, value] : kOtherValue) {
        if (base_env.count(name)) continue;
        std::map<std::string, std::string> vars = base_env;
        vars[name] = value;
        const EnvLookup env = env_of(vars);
        Config changed;
        try {
          changed = load_config(env);
        } catch (const Error&) {
          continue;  // refused with this algorithm (sbc with scatter): said, not ignored
        }
        if (!names(inert_settings(changed, env), name)) continue;  // the algorithm reads it
        if (tunes(*find_var(name), changed)) seen_idle.insert(name);
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
            << " (with " << base_env.size() - 1 << " other settings), but its results differ";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 120u);
  // Every conditional reader was caught idle at least once above.
  for (const ConfigVar& v : config_table()) {
    if (v.idle_because == nullptr) continue;
    EXPECT_TRUE(seen_idle.count(v.name)) << v.name;
  }
}

// Where compcoll is off, the PyTorch autoload and the NCCL interposer leave
// the application's backend alone and read no COMPCOLL_* variable: a user who
// set some (or mistyped COMPCOLL_ALGO) is told, in one message.
TEST(SettingsUnreadWhileOff, NamesEverySettingAndTheNearestNameOfAMistypedOne) {
  const std::string m = settings_unread_while_off(
      {"PATH=/bin", "COMPCOLL_ALGORITHM=dgc", "COMPCOLL_DENSITY=0.01",
       "COMPCOLL_STATS_FILE=/tmp/s{rank}.json", "COMPCOLL_VENV=/x/.venv"},
      "this 'gloo' group is torch's own");
  EXPECT_EQ(m.rfind("COMPCOLL_ALGO is unset, so compcoll is off and this 'gloo' group is torch's "
                    "own: COMPCOLL_ALGORITHM=dgc, COMPCOLL_DENSITY=0.01 and "
                    "COMPCOLL_STATS_FILE=/tmp/s{rank}.json change nothing; COMPCOLL_ALGORITHM is "
                    "not a compcoll variable and is ignored; did you mean COMPCOLL_ALGO?",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find("COMPCOLL_ALGO?; set COMPCOLL_ALGO to one of dgc, sbc, sdagc, csc, onebit, auto "
                   "to compress"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("COMPCOLL_VENV"), std::string::npos) << m;  // the scripts' own, not a setting
  EXPECT_EQ(m.find("dense,"), std::string::npos) << m;
}

TEST(SettingsUnreadWhileOff, DenseIsNamedAndNothingElseSetSaysNothing) {
  const std::string m =
      settings_unread_while_off({"COMPCOLL_ALGO=dense", "COMPCOLL_DEBUG=INFO"}, "NCCL runs");
  EXPECT_EQ(m.rfind("COMPCOLL_ALGO=dense, so compcoll is off and NCCL runs: COMPCOLL_DEBUG=INFO "
                    "changes nothing; set",
                    0),
            0u)
      << m;
  EXPECT_EQ(settings_unread_while_off({"COMPCOLL_ALGO=dense", "COMPCOLL_VENV=/v", "PATH=/bin"},
                                      "NCCL runs"),
            "");
  EXPECT_EQ(settings_unread_while_off({}, "NCCL runs"), "");
  // A long path is shortened: the names are what the reader looks for.
  const std::string path(200, 'p');
  const std::string long_value =
      settings_unread_while_off({"COMPCOLL_STATE_DIR=/" + path}, "NCCL runs");
  EXPECT_NE(long_value.find("COMPCOLL_STATE_DIR=/" + path.substr(0, 44) + "... changes nothing"),
            std::string::npos)
      << long_value;
}

}  // namespace
}  // namespace compcoll
