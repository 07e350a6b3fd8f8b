// COMPCOLL_MOMENTUM_HANDOVER=auto at the Communicator: adopting the
// optimizer's momentum before the first call computes exactly what the
// explicit recipe (COMPCOLL_MOMENTUM=m, COMPCOLL_MOMENTUM_HANDOVER=1 for
// SGD's handed-over momentum, =0 for Adam's moved one, masking at 2 x
// density) computes; adopting it mid-run keeps the residuals; a checkpoint
// carries it and its kind; nothing changes where the configuration does not
// take the optimizer's momentum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/lent_comm.h"
#include "collectives/momentum_handover.h"
#include "plugin/communicator.h"
#include "tests/support/gloo_harness.h"

namespace compcoll {
namespace {

Config auto_config(const std::string& algo) {
  Config c;
  c.algo = algo;
  c.min_elems = 1000;
  c.params.density = 0.01;
  c.params.warmup_steps = 4;  // through the warm-up: masking starts after it
  c.params.momentum_masking_density = -1.0;  // "auto", the default
  c.params.momentum_from_optimizer = true;   // COMPCOLL_MOMENTUM_HANDOVER=auto, the default
  c.params.selection = Selection::kAuto;     // COMPCOLL_SELECTION=auto: normalized under Adam
  if (algo == "csc") c.params.csc_chunk = 1000;
  return c;
}

// What a user who knows the optimizer's momentum configures by hand.
Config explicit_recipe(const std::string& algo, OptimizerMomentum taken) {
  Config c = auto_config(algo);
  c.params.momentum_from_optimizer = false;
  c.params.momentum = taken.m;
  c.params.momentum_handover = !taken.moved;
  // Masking: at every step for Adam's moved beta1 (dgc, sdagc, sbc), else
  // from the warm-up's last stage (csc: after its warm-up).
  c.params.momentum_masking_density =
      taken.moved && algo != "csc" ? 1.0
                                   : 2.0 * (algo == "csc" ? c.params.csc_fraction : c.params.density);
  // Adam moves every element by about its learning rate: rank by normalized value.
  c.params.selection = taken.moved ? Selection::kNormalized : Selection::kMagnitude;
  return c;
}

std::vector<float> gradient(int rank, int step, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.29f * float(i) + 0.7f * float(step) + 1.9f * float(rank)) /
           (1.0f + float(i % 61));
  }
  return g;
}

constexpr size_t kCount = 12345;

std::vector<std::vector<float>> steps(Communicator& cc, int from, int to) {
  std::vector<std::vector<float>> out;
  for (int s = from; s < to; ++s) {
    std::vector<float> g = gradient(cc.rank(), s, kCount);
    cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kAvg, "w");
    out.push_back(std::move(g));
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Adopt : public ::testing::TestWithParam<std::string> {};

TEST_P(Adopt, BeforeTheFirstCallEqualsTheExplicitRecipeBitForBit) {
  testing::run_gloo_ranks(3, [&](Comm& comm) {
    std::vector<std::vector<float>> handed_over;
    for (const bool moved : {false, true}) {
      const OptimizerMomentum taken{0.9f, moved};
      Communicator recipe(std::make_unique<LentComm>(comm), explicit_recipe(GetParam(), taken));
      const auto want = steps(recipe, 0, 10);
      Communicator adopted(std::make_unique<LentComm>(comm), auto_config(GetParam()));
      EXPECT_TRUE(adopted.adopt_optimizer_momentum(taken));
      EXPECT_FALSE(adopted.adopt_optimizer_momentum(taken));  // already in use
      EXPECT_EQ(adopted.optimizer_momentum(), taken);
      const auto got = steps(adopted, 0, 10);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(same_bits(want[i], got[i])) << GetParam() << " moved " << moved << " call " << i;
      }
      // Without the adoption the calls differ, and so do the two kinds: the
      // test can fail.
      Communicator plain(std::make_unique<LentComm>(comm), auto_config(GetParam()));
      const auto other = steps(plain, 0, 10);
      EXPECT_FALSE(same_bits(other[9], want[9]));
      if (moved) {
        EXPECT_FALSE(same_bits(handed_over[9], want[9]));
      }
      if (!moved) handed_over = want;
      if (moved && (GetParam() == "dgc" || GetParam() == "sdagc")) {
        // The moved momentum's recipe ranks by normalized value, and that
        // changes what is sent.
        Config by_magnitude = explicit_recipe(GetParam(), taken);
        by_magnitude.params.selection = Selection::kMagnitude;
        Communicator magnitude(std::make_unique<LentComm>(comm), by_magnitude);
        EXPECT_FALSE(same_bits(steps(magnitude, 0, 10)[9], want[9])) << GetParam();
      }
    }
  });
}

// Mid-run: the residual is kept (nothing is lost), the velocity and the
// mirror start at zero, and a checkpoint taken afterwards carries the
// momentum, so that a resumed run continues bit for bit before its
// optimizer has stepped again.
TEST_P(Adopt, MidRunKeepsTheResidualAndACheckpointCarriesTheMomentum) {
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    for (const bool moved : {false, true}) {
      const OptimizerMomentum taken{0.5f, moved};
      std::vector<std::vector<float>> whole, resumed;
      {
        Communicator cc(std::make_unique<LentComm>(comm), auto_config(GetParam()));
        whole = steps(cc, 0, 3);
        ASSERT_TRUE(cc.adopt_optimizer_momentum(taken));
        for (auto& r : steps(cc, 3, 9)) whole.push_back(std::move(r));
      }
      Bytes saved;
      {
        Communicator cc(std::make_unique<LentComm>(comm), auto_config(GetParam()));
        resumed = steps(cc, 0, 3);
        ASSERT_TRUE(cc.adopt_optimizer_momentum(taken));
        for (auto& r : steps(cc, 3, 6)) resumed.push_back(std::move(r));
        saved = cc.save_state();
      }
      Communicator cc(std::make_unique<LentComm>(comm), auto_config(GetParam()));
      ASSERT_TRUE(cc.load_state(saved));
      EXPECT_EQ(cc.optimizer_momentum(), taken);
      for (auto& r : steps(cc, 6, 9)) resumed.push_back(std::move(r));
      for (size_t i = 0; i < whole.size(); ++i) {
        EXPECT_TRUE(same_bits(whole[i], resumed[i])) << GetParam() << " moved " << moved
                                                     << " call " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Adopt, ::testing::Values("dgc", "sdagc", "sbc", "csc"));

TEST(Adopt, ChangesNothingWhereTheConfigurationDoesNotTakeIt) {
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    for (const char* algo : {"onebit", "dense", "auto"}) {
      Communicator cc(std::make_unique<LentComm>(comm), auto_config(algo));
      EXPECT_FALSE(cc.adopt_optimizer_momentum({0.9f})) << algo;
      EXPECT_FALSE(cc.adopt_optimizer_momentum({0.9f, true})) << algo;
      EXPECT_EQ(cc.optimizer_momentum().m, 0.0f) << algo;
    }
    Config configured = auto_config("dgc");
    configured.params.momentum = 0.9f;  // the script runs DGC's own recipe (optimizer momentum 0)
    Communicator cc(std::make_unique<LentComm>(comm), configured);
    EXPECT_FALSE(cc.adopt_optimizer_momentum({0.9f}));
    Config off = auto_config("dgc");
    off.params.momentum_from_optimizer = false;  // COMPCOLL_MOMENTUM_HANDOVER=0
    Communicator cc_off(std::make_unique<LentComm>(comm), off);
    EXPECT_FALSE(cc_off.adopt_optimizer_momentum({0.9f, true}));
  });
}

TEST(Adopt, ParametersResolveMaskingAfterTheWarmUpUnderSgdAndAlwaysUnderAdam) {
  AlgoParams p;
  p.density = 0.001;
  p.momentum_masking_density = -1.0;
  p.momentum_from_optimizer = true;
  EXPECT_TRUE(takes_optimizer_momentum("dgc", p));
  EXPECT_TRUE(takes_optimizer_momentum("sbc", p));
  EXPECT_FALSE(takes_optimizer_momentum("onebit", p));
  const AlgoParams q = optimizer_momentum_params("dgc", p, {0.9f});
  EXPECT_EQ(q.momentum, 0.9f);
  EXPECT_TRUE(q.momentum_handover);
  EXPECT_DOUBLE_EQ(q.momentum_masking_density, 0.002);
  // Adam's beta1, moved: dgc, sdagc and sbc mask at every step; csc as under SGD.
  const AlgoParams moved = optimizer_momentum_params("dgc", p, {0.9f, true});
  EXPECT_EQ(moved.momentum, 0.9f);
  EXPECT_FALSE(moved.momentum_handover);
  EXPECT_DOUBLE_EQ(moved.momentum_masking_density, 1.0);
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("sdagc", p, {0.9f, true}).momentum_masking_density,
                   1.0);
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("sbc", p, {0.9f, true}).momentum_masking_density, 1.0);
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("csc", p, {0.9f, true}).momentum_masking_density,
                   0.02);
  // csc: after its warm-up, at 2 x its chunk fraction.
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("csc", p, {0.9f}).momentum_masking_density, 0.02);
  // sbc: as dgc (its exact warm-up is dgc's).
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("sbc", p, {0.9f}).momentum_masking_density, 0.002);
  p.momentum_masking_density = 0.05;  // set by the user: kept
  EXPECT_DOUBLE_EQ(optimizer_momentum_params("dgc", p, {0.9f}).momentum_masking_density, 0.05);
  EXPECT_DOUBLE_EQ(masking_density_or_always(AlgoParams{}), 1.0);
  EXPECT_EQ(optimizer_momentum_params("dgc", p, {0.0f}).momentum, 0.0f);
}

}  // namespace
}  // namespace compcoll
