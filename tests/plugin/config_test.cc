// The configuration table: defaults, every kind of bad value rejected with
// the variable, the value and what is allowed; the torchrun fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/registry.h"
#include "compcoll/error.h"
#include "compression/payload.h"
#include "plugin/config.h"
#include "tests/plugin/env_of.h"

namespace compcoll {
namespace {

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    load_config(env_of(std::move(vars)));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsMatchTheDesign) {
  const Config c = load_config(env_of({}));
  EXPECT_EQ(c.algo, "dense");
  EXPECT_FALSE(c.compression_enabled());
  // COMPCOLL_DENSITY=auto: dgc and sdagc spend a budget of 0.006 x 2.125
  // bytes per element on fp8 + rice entries (b* = 7 near 0.006: 2.125 bytes
  // each), so 0.006 (to rounding); sbc's entry, a
  // sign bit and a position, is under the budget at any of these settings
  // and runs at 0.002 (docs/convergence.md).
  EXPECT_EQ(c.params.density, kAutoDensity);
  EXPECT_EQ(c.params.values, ValueType::kFp8);
  EXPECT_EQ(c.params.indices, IndexType::kRiceGap);
  EXPECT_NEAR(density_for("dgc", c.params), 0.006, 1e-15);
  EXPECT_NEAR(density_for("sdagc", c.params), 0.006, 1e-15);
  EXPECT_NEAR(density_for("auto", c.params), 0.006, 1e-15);  // weighs dgc
  EXPECT_DOUBLE_EQ(density_for("sbc", c.params), 0.002);
  EXPECT_EQ(c.params.momentum, 0.0f);
  EXPECT_EQ(c.min_elems, 16384u);
  EXPECT_EQ(c.params.csc_chunk, 16384u);
  EXPECT_DOUBLE_EQ(c.params.csc_fraction, 0.01);
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_EQ(c.timeout.count(), 30000);
  EXPECT_EQ(c.rank, -1);
}

// At the defaults sbc's exact warm-up is dgc's: the same payload bytes from
// the same gradients (dgc's fp8 values and Rice-coded gaps, and under
// COMPCOLL_DENSITY=auto dgc's density, not sbc's), and sbc's own payload at
// sbc's density once the warm-up is over. An explicit density is both's.
TEST(Config, SbcWarmsUpAsDgcDoesAtTheDefaults) {
  const size_t n = 50000;
  for (const char* density : {"auto", "0.003"}) {
    auto params = load_config(env_of({{"COMPCOLL_DENSITY", density},
                                      {"COMPCOLL_WARMUP_STEPS", "3"}})).params;
    params.momentum = 0.9f;  // as the momentum hand-over sets it
    const auto sbc = make_sparse_codec("sbc", params);
    const auto dgc = make_sparse_codec("dgc", params);
    auto s = sbc->make_state(n);
    auto d = dgc->make_state(n);
    std::vector<float> g(n);
    for (uint64_t step = 0; step < 5; ++step) {
      for (size_t i = 0; i < n; ++i) {
        g[i] = std::sin(0.37f * float(i) + float(step)) * (1.0f + float(i % 7));
      }
      Bytes a, b;
      const EncodeInfo ia = sbc->encode(g.data(), n, *s, a);
      const EncodeInfo ib = dgc->encode(g.data(), n, *d, b);
      if (step < 3) {
        EXPECT_EQ(a, b) << density << " step " << step;
        EXPECT_DOUBLE_EQ(ia.density, ib.density) << density << " step " << step;
      } else {
        EXPECT_EQ(peek_format(a), PayloadFormat::kSbc) << density << " step " << step;
        EXPECT_DOUBLE_EQ(ia.density, density_for("sbc", params)) << density << " step " << step;
      }
    }
  }
  // Under auto the two densities differ, so the warm-up above really ran at dgc's.
  const auto defaults = load_config(env_of({})).params;
  EXPECT_GT(density_for("dgc", defaults), density_for("sbc", defaults));
}

TEST(Config, AutoDensityKeepsItsByteBudgetAndAnExplicitDensityWins) {
  auto density = [](std::map<std::string, std::string> env, const char* algo) {
    return density_for(algo, load_config(env_of(env)).params);
  };
  constexpr double kBudget = 0.006 * 2.125;  // bytes per element
  // Fixed-size entries: 8 bytes (fp32 + u32), 6 (one field compact), 4.
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp32"}, {"COMPCOLL_INDEX_CODING", "u32"}}, "dgc"),
                   kBudget / 8.0);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp32"}, {"COMPCOLL_INDEX_CODING", "varint"}},
                           "sdagc"),
                   kBudget / 6.0);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "bf16"}, {"COMPCOLL_INDEX_CODING", "varint"}},
                           "dgc"),
                   kBudget / 4.0);
  // Rice codes cost b* + 2 bits, b* from the density: fp8 + rice (the
  // default) settles at b* = 7 (2.125 bytes), fp16 + rice at b* = 7 near
  // 0.0041 (3.125 bytes), fp32 + rice at b* = 8 near 0.0024 (5.25 bytes).
  EXPECT_DOUBLE_EQ(density({}, "dgc"), kBudget / 2.125);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp16"}}, "dgc"), kBudget / 3.125);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp16"}}, "sdagc"), kBudget / 3.125);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp32"}}, "dgc"), kBudget / 5.25);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp32"}}, "sdagc"), kBudget / 5.25);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_VALUE_DTYPE", "fp16"}})).params.values, ValueType::kFp16);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_INDEX_CODING", "varint"}})).params.indices,
            IndexType::kVarintGap);
  EXPECT_NE(error_of({{"COMPCOLL_VALUE_DTYPE", "fp4"}}).find("fp32|fp16|bf16|fp8"), std::string::npos);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_DENSITY", "auto"}}, "dgc"), kBudget / 2.125);
  // sbc sends no values: the value type does not move its density.
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_VALUE_DTYPE", "fp32"}, {"COMPCOLL_INDEX_CODING", "u32"}}, "sbc"),
                   0.002);
  EXPECT_DOUBLE_EQ(density({{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "sbc"}}, "auto"), 0.002);
  for (const char* algo : {"dgc", "sdagc", "sbc", "auto"}) {
    EXPECT_DOUBLE_EQ(density({{"COMPCOLL_DENSITY", "0.01"}}, algo), 0.01) << algo;
  }
  EXPECT_NE(error_of({{"COMPCOLL_DENSITY", "automatic"}}).find("COMPCOLL_DENSITY"), std::string::npos);
}

TEST(Config, ReadsEveryKindOfValue) {
  const Config c = load_config(env_of({{"COMPCOLL_ALGO", "sdagc"},
                                       {"COMPCOLL_DENSITY", "0.01"},
                                       {"COMPCOLL_MOMENTUM", "0.9"},
                                       {"COMPCOLL_NESTEROV", "true"},
                                       {"COMPCOLL_VALUE_DTYPE", "fp16"},
                                       {"COMPCOLL_INDEX_CODING", "varint"},
                                       {"COMPCOLL_ONEBIT_SCALE", "pair"},
                                       {"COMPCOLL_TIMEOUT_MS", "1500"},
                                       {"COMPCOLL_DEBUG", "TRACE"},
                                       {"RANK", "3"},
                                       {"WORLD_SIZE", "8"}}));
  EXPECT_EQ(c.algo, "sdagc");
  EXPECT_DOUBLE_EQ(c.params.density, 0.01);
  EXPECT_FLOAT_EQ(c.params.momentum, 0.9f);
  EXPECT_TRUE(c.params.nesterov);
  EXPECT_EQ(c.params.values, ValueType::kFp16);
  EXPECT_EQ(c.params.indices, IndexType::kVarintGap);
  EXPECT_EQ(c.params.onebit_scale, ScaleMode::kSignedMeans);
  EXPECT_EQ(c.timeout.count(), 1500);
  EXPECT_EQ(c.debug, LogLevel::kTrace);
  EXPECT_EQ(c.rank, 3);  // torchrun's RANK / WORLD_SIZE
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_RANK", "1"}, {"RANK", "3"}})).rank, 1);
}

TEST(Config, UnknownAlgorithmIsRejectedWithTheRegisteredNames) {
  const std::string e = error_of({{"COMPCOLL_ALGO", "topk"}});
  EXPECT_NE(e.find("COMPCOLL_ALGO=topk"), std::string::npos) << e;
  EXPECT_NE(e.find("dgc"), std::string::npos) << e;
  EXPECT_NE(e.find("onebit"), std::string::npos) << e;
}

// A word of a closed set typed in another case or with blanks is still
// refused (the ranks compare the values as given) but named, and so is one
// a slip away from a single word ("dcg"); a boolean is read in any case.
TEST(Config, AMistypedWordIsNamedWithTheWordMeant) {
  for (const auto& [var, bad, meant] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"COMPCOLL_ALGO", "DGC", "dgc"},
           {"COMPCOLL_ALGO", "dgc ", "dgc"},
           {"COMPCOLL_ALGO", "dcg", "dgc"},
           {"COMPCOLL_ALGO", "onebti", "onebit"},
           {"COMPCOLL_NESTEROV", "ture", "true"},
           {"COMPCOLL_HIERARCHY", " Host", "host"},
           // "auto" beside a number or a boolean: named, not "not a number".
           {"COMPCOLL_DENSITY", "AUTO", "auto"},
           {"COMPCOLL_CODEC_THREADS", "Auto", "auto"},
           {"COMPCOLL_MOMENTUM_HANDOVER", "AUTO", "auto"},
           {"COMPCOLL_MOMENTUM_MASKING_DENSITY", "auto ", "auto"}}) {
    const std::string e = error_of({{var, bad}});
    // A value with a blank at either end is quoted, or the blank is invisible.
    const bool blank = bad.front() == ' ' || bad.back() == ' ';
    EXPECT_NE(e.find(var + "=" + (blank ? "\"" + bad + "\"" : bad) + ": "), std::string::npos) << e;
    EXPECT_NE(e.find("did you mean '" + meant + "'?"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of({{"COMPCOLL_ALGO", "topk"}}).find("did you mean"), std::string::npos);
  for (const char* yes : {"TRUE", "True", "Yes", "ON", "1"}) {
    EXPECT_TRUE(load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_NESTEROV", yes}}))
                    .params.nesterov)
        << yes;
  }
}

TEST(Config, DensityOutsideZeroOneIsRejected) {
  for (const char* bad : {"0", "-0.1", "1.5", "1e9"}) {
    const std::string e = error_of({{"COMPCOLL_DENSITY", bad}});
    EXPECT_NE(e.find(std::string("COMPCOLL_DENSITY=") + bad), std::string::npos) << e;
    EXPECT_NE(e.find("(0, 1]"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of({{"COMPCOLL_DENSITY", "1"}}), "");
}

TEST(Config, NegativeOrZeroTimeoutIsRejected) {
  for (const char* bad : {"-1", "0", "-30000"}) {
    const std::string e = error_of({{"COMPCOLL_TIMEOUT_MS", bad}});
    EXPECT_NE(e.find("COMPCOLL_TIMEOUT_MS"), std::string::npos) << e;
    EXPECT_NE(e.find(">= 1"), std::string::npos) << e;
  }
}

TEST(Config, UnparseableNumbersAreRejected) {
  for (const auto& [var, bad] : std::map<std::string, std::string>{
           {"COMPCOLL_DENSITY", "abc"},
           {"COMPCOLL_MOMENTUM", "0.9x"},
           {"COMPCOLL_TIMEOUT_MS", "30s"},
           {"COMPCOLL_MIN_ELEMS", "1e4"},
           {"COMPCOLL_CLIP", "nan"},
           {"COMPCOLL_WARMUP_STEPS", "99999999999999999999"},
           {"COMPCOLL_NESTEROV", "maybe"}}) {
    const std::string e = error_of({{var, bad}});
    EXPECT_NE(e.find(var + "=" + bad), std::string::npos) << e;
    EXPECT_NE(e.find("allowed"), std::string::npos) << e;
  }
}

// Blanks around a number are accepted on either side alike; blanks alone
// are no number; a value a double cannot hold says so.
TEST(Config, BlanksAroundANumberAreAcceptedOnEitherSide) {
  for (const char* v : {"0.1", " 0.1", "0.1 ", " 0.1\t"}) {
    EXPECT_DOUBLE_EQ(load_config(env_of({{"COMPCOLL_DENSITY", v}})).params.density, 0.1) << v;
  }
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_MIN_ELEMS", "64 "}})).min_elems, 64u);
  EXPECT_NE(error_of({{"COMPCOLL_DENSITY", "  "}}).find("not a finite number"), std::string::npos);
  EXPECT_NE(error_of({{"COMPCOLL_MIN_ELEMS", " "}}).find("not an integer"), std::string::npos);
  for (const char* v : {"1e-400", "1e400"}) {
    EXPECT_NE(error_of({{"COMPCOLL_DENSITY", v}}).find("too small or too large"), std::string::npos)
        << v;
  }
}

TEST(Config, OtherBadValuesAreRejected) {
  EXPECT_NE(error_of({{"COMPCOLL_MOMENTUM", "1"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_ONEBIT_BLOCK", "1000"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_VALUE_DTYPE", "fp4"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_TRANSPORT", "udp"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_RENDEZVOUS", "/tmp/x"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_DEBUG", "LOUD"}}), "");
  // A log level in any case, as NCCL_DEBUG.
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_DEBUG", "info"}})).debug, LogLevel::kInfo);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_DEBUG", " Trace"}})).debug, LogLevel::kTrace);
  // An interface and an address: read (a tool that binds nothing, such as
  // compcoll-info or the codec table, runs); the tcp device refuses them
  // together (c_api_test.cc).
  EXPECT_EQ(error_of({{"COMPCOLL_IFACE", "lo"}, {"COMPCOLL_HOSTNAME", "127.0.0.1"}}), "");
  EXPECT_NE(error_of({{"COMPCOLL_RANK", "4"}, {"COMPCOLL_WORLD_SIZE", "4"}}), "");
}

TEST(Config, EveryTableEntryIsDocumented) {
  for (const ConfigVar& v : config_table()) {
    EXPECT_EQ(std::string(v.name).rfind("COMPCOLL_", 0), 0u) << v.name;
    EXPECT_GT(std::string(v.doc).size(), 10u) << v.name;
    EXPECT_GT(std::string(v.allowed).size(), 0u) << v.name;
  }
}

// Each error states the allowed values once (reject() appends them; the
// reason must not repeat them).
TEST(Config, ErrorsStateTheAllowedValuesOnce) {
  for (const auto& [var, bad] : std::map<std::string, std::string>{
           {"COMPCOLL_DENSITY", "2"},
           {"COMPCOLL_MOMENTUM", "1"},
           {"COMPCOLL_CSC_FRACTION", "0"},
           {"COMPCOLL_TIMEOUT_MS", "0"},
           {"COMPCOLL_CSC_CHUNK", "0"}}) {
    const std::string e = error_of({{var, bad}});
    std::string allowed;
    for (const ConfigVar& v : config_table()) {
      if (var == v.name) allowed = v.allowed;
    }
    ASSERT_FALSE(allowed.empty()) << var;
    const size_t first = e.find(allowed);
    ASSERT_NE(first, std::string::npos) << e;
    EXPECT_EQ(e.find(allowed, first + 1), std::string::npos) << "range given twice: " << e;
    EXPECT_EQ(e.rfind("compcoll: " + var + "=" + bad + ": ", 0), 0u) << e;
  }
}

TEST(Config, IbverbsIsRefusedWithTheReason) {
  const std::string e = error_of({{"COMPCOLL_TRANSPORT", "ibverbs"}});
  EXPECT_NE(e.find("COMPCOLL_TRANSPORT=ibverbs"), std::string::npos) << e;
  EXPECT_NE(e.find("not available in this build"), std::string::npos) << e;
  EXPECT_NE(e.find("unbound"), std::string::npos) << e;
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_TRANSPORT", "tcp"}})).transport, "tcp");
}

TEST(Config, OnebitScaleIsDescribedByItsName) {
  EXPECT_NE(load_config(env_of({})).agreement_description().find("onebit_scale=mean"),
            std::string::npos);
  EXPECT_NE(load_config(env_of({{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_ONEBIT_SCALE", "pair"}}))
                .agreement_description()
                .find("onebit_scale=pair"),
            std::string::npos);
}

// A setting the front end does not read (said to change nothing there) is
// no disagreement between its ranks: a rank with COMPCOLL_TORCH_SCOPE=all
// under the C API creates its communicator with ranks without it.
TEST(Config, SettingsTheFrontEndDoesNotReadAreNotAgreedOn) {
  auto described = [](FrontEnd fe, std::map<std::string, std::string> vars) {
    vars["COMPCOLL_ALGO"] = "dgc";
    Config c = load_config(env_of(vars));
    c.front_end = fe;
    return c.agreement_description();
  };
  for (const auto& [var, value, reader] :
       std::vector<std::tuple<std::string, std::string, FrontEnd>>{
           {"COMPCOLL_TORCH_SCOPE", "all", FrontEnd::kTorchBackend},
           {"COMPCOLL_NCCL_COMMS", "multi-host", FrontEnd::kNcclInterposer}}) {
    EXPECT_EQ(described(FrontEnd::kStandalone, {{var, value}}),
              described(FrontEnd::kStandalone, {}))
        << var;
    EXPECT_NE(described(reader, {{var, value}}), described(reader, {})) << var;
  }
}

TEST(Config, OnebitResidualBoundIsCheckedAndPartOfTheAgreement) {
  EXPECT_NE(load_config(env_of({})).agreement_description().find("onebit_residual_bound=0.5;"),
            std::string::npos);
  const Config c =
      load_config(env_of({{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_ONEBIT_RESIDUAL_BOUND", "0"}}));
  EXPECT_EQ(c.params.onebit_residual_bound, 0.0f);
  EXPECT_NE(c.agreement_description().find("onebit_residual_bound=0;"), std::string::npos);
  for (const char* bad : {"-1", "inf", "nan", "x"}) {
    const std::string e = error_of({{"COMPCOLL_ONEBIT_RESIDUAL_BOUND", bad}});
    EXPECT_NE(e.find("COMPCOLL_ONEBIT_RESIDUAL_BOUND="), std::string::npos) << bad << ": " << e;
  }
}

// Ranks agree on the settings that change something for their
// configuration: one that changes nothing (and is said to, at WARN) enters
// at its default, so a rank that alone sets it is not refused as a
// mismatch besides. Under the algorithm it tunes it counts again.
TEST(Config, ASettingThatChangesNothingDoesNotEnterTheAgreement) {
  const std::string plain = load_config(env_of({{"COMPCOLL_ALGO", "dgc"}})).agreement_description();
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_CSC_CHUNK", "100"}}))
                .agreement_description(),
            plain);
  // Idle under another setting: no warm-up to shape.
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_STEPS", "0"}}))
                .agreement_description(),
            load_config(env_of({{"COMPCOLL_ALGO", "dgc"},
                                {"COMPCOLL_WARMUP_STEPS", "0"},
                                {"COMPCOLL_WARMUP_SHAPE", "stages"}}))
                .agreement_description());
  const std::string csc = load_config(env_of({{"COMPCOLL_ALGO", "csc"}})).agreement_description();
  EXPECT_NE(load_config(env_of({{"COMPCOLL_ALGO", "csc"}, {"COMPCOLL_CSC_CHUNK", "100"}}))
                .agreement_description(),
            csc);
  EXPECT_NE(load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_DENSITY", "0.01"}}))
                .agreement_description(),
            plain);
}

TEST(Config, SbcWarmUpIsExactByDefaultAndPartOfTheAgreement) {
  const Config d = load_config(env_of({}));
  EXPECT_TRUE(d.params.sbc_exact_warmup);
  EXPECT_NE(d.agreement_description().find("sbc_warmup=exact;"), std::string::npos);
  const Config b = load_config(env_of({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_SBC_WARMUP", "binary"}}));
  EXPECT_FALSE(b.params.sbc_exact_warmup);
  EXPECT_NE(b.agreement_description().find("sbc_warmup=binary;"), std::string::npos);
  const std::string e = error_of({{"COMPCOLL_SBC_WARMUP", "dense"}});
  EXPECT_NE(e.find("COMPCOLL_SBC_WARMUP=dense"), std::string::npos) << e;
  EXPECT_NE(e.find("exact|binary"), std::string::npos) << e;
}

TEST(Config, WarmUpShapeIsSmoothByDefaultAndPartOfTheAgreement) {
  const Config d = load_config(env_of({}));
  EXPECT_EQ(d.params.warmup_shape, WarmupShape::kSmooth);
  EXPECT_NE(d.agreement_description().find("warmup_shape=smooth;"), std::string::npos);
  const Config s = load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_WARMUP_SHAPE", "stages"}}));
  EXPECT_EQ(s.params.warmup_shape, WarmupShape::kStages);
  EXPECT_NE(s.agreement_description().find("warmup_shape=stages;"), std::string::npos);
  const std::string e = error_of({{"COMPCOLL_WARMUP_SHAPE", "linear"}});
  EXPECT_NE(e.find("COMPCOLL_WARMUP_SHAPE=linear"), std::string::npos) << e;
  EXPECT_NE(e.find("smooth|stages"), std::string::npos) << e;
}

TEST(Config, SbcSendsBothSidesByDefaultAndItIsPartOfTheAgreement) {
  const Config d = load_config(env_of({}));
  EXPECT_TRUE(d.params.sbc_both_sides);
  EXPECT_NE(d.agreement_description().find("sbc_sides=both;"), std::string::npos);
  const Config one = load_config(env_of({{"COMPCOLL_ALGO", "sbc"}, {"COMPCOLL_SBC_SIDES", "one"}}));
  EXPECT_FALSE(one.params.sbc_both_sides);
  EXPECT_NE(one.agreement_description().find("sbc_sides=one;"), std::string::npos);
  const std::string e = error_of({{"COMPCOLL_SBC_SIDES", "two"}});
  EXPECT_NE(e.find("COMPCOLL_SBC_SIDES=two"), std::string::npos) << e;
  EXPECT_NE(e.find("both|one"), std::string::npos) << e;
}

TEST(Config, SelectionIsAutoByDefaultAndItIsPartOfTheAgreement) {
  const Config d = load_config(env_of({}));
  EXPECT_EQ(d.params.selection, Selection::kAuto);
  EXPECT_NE(d.agreement_description().find("selection=auto;"), std::string::npos);
  const Config n = load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SELECTION", "normalized"}}));
  EXPECT_EQ(n.params.selection, Selection::kNormalized);
  EXPECT_NE(n.agreement_description().find("selection=normalized;"), std::string::npos);
  const Config m = load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SELECTION", "magnitude"}}));
  EXPECT_EQ(m.params.selection, Selection::kMagnitude);
  EXPECT_NE(m.agreement_description().find("selection=magnitude;"), std::string::npos);
  const std::string e = error_of({{"COMPCOLL_SELECTION", "adam"}});
  EXPECT_NE(e.find("COMPCOLL_SELECTION=adam"), std::string::npos) << e;
  EXPECT_NE(e.find("magnitude|normalized|auto"), std::string::npos) << e;
}

std::string suggestion_for(const std::string& entry) {
  const auto u = unknown_variables({entry});
  return u.size() == 1 ? u[0].suggestion : "<not reported>";
}

TEST(Config, SparsePatternDefaultsToAutoAndIsPartOfTheAgreement) {
  EXPECT_EQ(load_config(env_of({})).params.sparse_pattern, SparsePattern::kAuto);
  const Config c =
      load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_SPARSE_PATTERN", "scatter"}}));
  EXPECT_EQ(c.params.sparse_pattern, SparsePattern::kScatter);
  EXPECT_NE(c.agreement_description().find("sparse_pattern=scatter"), std::string::npos);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_SPARSE_PATTERN", "allgather"}})).params.sparse_pattern,
            SparsePattern::kAllgather);
  const std::string e = error_of({{"COMPCOLL_SPARSE_PATTERN", "ring"}});
  EXPECT_NE(e.find("COMPCOLL_SPARSE_PATTERN=ring"), std::string::npos) << e;
  EXPECT_NE(e.find("allgather|scatter|auto"), std::string::npos) << e;
}

// Threads never change the bits (DgcThreads.*), so ranks may run different
// numbers: the agreement and the checkpoint's description leave them out.
TEST(Config, CodecThreadsAreReadButNotAgreedOn) {
  EXPECT_EQ(load_config(env_of({})).params.codec_threads, kAutoCodecThreads);
  EXPECT_EQ(load_config(env_of({{"COMPCOLL_CODEC_THREADS", "auto"}})).params.codec_threads,
            kAutoCodecThreads);
  const Config c = load_config(env_of({{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_CODEC_THREADS", "8"}}));
  EXPECT_EQ(c.params.codec_threads, 8);
  EXPECT_EQ(c.agreement_description(),
            load_config(env_of({{"COMPCOLL_ALGO", "dgc"}})).agreement_description());
  EXPECT_NE(error_of({{"COMPCOLL_CODEC_THREADS", "0"}}).find("COMPCOLL_CODEC_THREADS=0"),
            std::string::npos);
}

TEST(UnknownVariables, NearestKnownNameIsSuggested) {
  EXPECT_EQ(suggestion_for("COMPCOLL_ALGOO=dgc"), "COMPCOLL_ALGO");
  EXPECT_EQ(suggestion_for("COMPCOLL_DENSTIY=0.01"), "COMPCOLL_DENSITY");  // transposition
  EXPECT_EQ(suggestion_for("COMPCOLL_DENSIT=0.01"), "COMPCOLL_DENSITY");
  EXPECT_EQ(suggestion_for("COMPCOLL_TIMEOUT=5000"), "COMPCOLL_TIMEOUT_MS");
  EXPECT_EQ(suggestion_for("COMPCOLL_algo=dgc"), "COMPCOLL_ALGO");  // case
  EXPECT_EQ(suggestion_for("COMPCOLL_STATS=x"), "COMPCOLL_STATS_FILE");
  EXPECT_EQ(suggestion_for("COMPCOLL_ALGORITHM=dgc"), "COMPCOLL_ALGO");  // spelled out
  EXPECT_EQ(suggestion_for("COMPCOLL_DENSITYY=0.01"), "COMPCOLL_DENSITY");
  EXPECT_EQ(suggestion_for("COMPCOLL_MOMENTUN"), "COMPCOLL_MOMENTUM");  // a bare name
  EXPECT_EQ(suggestion_for("COMPCOLL_ZZZZZZZZZZ=1"), "");  // nothing close
}

TEST(UnknownVariables, KnownNamesAndOtherPrefixesAreNotReported) {
  std::vector<std::string> env;
  for (const ConfigVar& v : config_table()) env.push_back(std::string(v.name) + "=x");
  for (const ToolVar& t : tool_variables()) env.push_back(std::string(t.name) + "=1");
  env.insert(env.end(), {"PATH=/usr/bin", "NCCL_DEBUG=INFO", "RANK=0", "XCOMPCOLL_ALGO=1",
                         "COMPCOLL=1"});
  EXPECT_TRUE(unknown_variables(env).empty());
  // A slip in the prefix is named too, where the rest is near a variable.
  const auto p = unknown_variables({"COMPCOL_ALGO=dgc", "compcoll_density=0.1",
                                    "COMPCOLLWARMUP_STEPS=3", "COMPCOLLECTOR_HOME=/x"});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].suggestion, "COMPCOLL_ALGO");
  EXPECT_EQ(p[1].suggestion, "COMPCOLL_DENSITY");
  EXPECT_EQ(p[2].suggestion, "COMPCOLL_WARMUP_STEPS");
  const auto u = unknown_variables({"PATH=/bin", "COMPCOLL_ALGOO=dgc", "COMPCOLL_ALGO=dgc"});
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].name, "COMPCOLL_ALGOO");
  EXPECT_EQ(u[0].message(),
            "COMPCOLL_ALGOO is not a compcoll variable and is ignored; did you mean COMPCOLL_ALGO?");
}

TEST(UnknownVariables, ToolVariablesAreNotConfiguration) {
  for (const ToolVar& t : tool_variables()) {
    for (const ConfigVar& v : config_table()) EXPECT_STRNE(t.name, v.name);
    EXPECT_EQ(std::string(t.name).rfind("COMPCOLL_", 0), 0u) << t.name;
    EXPECT_GT(std::string(t.doc).size(), 5u) << t.name;
  }
}

}  // namespace
}  // namespace compcoll
