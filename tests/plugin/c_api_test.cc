// The C API's contract with the framework that calls it, through
// libcompcoll.so itself:
// - compcoll_comm_create's explicit rendezvous, rank and world size replace
//   the environment's, which is neither read nor checked: a framework that
//   makes its own communicator inside torchrun's job (RANK, WORLD_SIZE set
//   for another purpose) is not refused for them;
// - from the environment, a launcher's bad RANK is named as RANK;
// - while a call runs, another thread's rescale_state and set_loss_scaled
//   are refused at once and touch nothing, and the stats getters answer as
//   of the last finished call.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "compcoll/compcoll.h"

namespace {

std::string make_dir() {
  char tmpl[] = "/tmp/compcoll-c-api-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d != nullptr ? d : "";
}

// Sets the variables for the test's lifetime, then unsets them.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars)
      : vars_(std::move(vars)) {
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : vars_) unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

// Runs body(rank, comm) on two threads, each holding its rank of a 2-rank
// communicator met in dir, then destroys it (which must succeed and leave
// compcoll_last_error empty).
template <typename Body>
void with_two_ranks(const std::string& dir, Body body) {
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      compcoll_comm_t* comm = nullptr;
      ASSERT_EQ(compcoll_comm_create(("file://" + dir).c_str(), rank, 2, &comm), COMPCOLL_SUCCESS)
          << compcoll_last_error();
      body(rank, comm);
      EXPECT_EQ(compcoll_comm_destroy(comm), COMPCOLL_SUCCESS) << compcoll_last_error();
      EXPECT_STREQ(compcoll_last_error(), "");
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(CApi, ExplicitArgumentsReplaceTheLaunchersEnvironment) {
  const std::string dir = make_dir();
  const ScopedEnv env({{"RANK", "5"},
                       {"WORLD_SIZE", "4"},
                       {"COMPCOLL_RANK", "3"},
                       {"COMPCOLL_WORLD_SIZE", "2"},
                       {"COMPCOLL_RENDEZVOUS", "tcp://nowhere:1"}});
  compcoll_comm_t* comm = nullptr;
  ASSERT_EQ(compcoll_comm_create(("file://" + dir).c_str(), 0, 1, &comm), COMPCOLL_SUCCESS)
      << compcoll_last_error();
  int rank = -1, size = -1;
  EXPECT_EQ(compcoll_comm_rank(comm, &rank), COMPCOLL_SUCCESS);
  EXPECT_EQ(compcoll_comm_size(comm, &size), COMPCOLL_SUCCESS);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  float x[4] = {1, 2, 3, 4};
  EXPECT_EQ(compcoll_allreduce(comm, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, nullptr),
            COMPCOLL_SUCCESS)
      << compcoll_last_error();
  EXPECT_EQ(compcoll_comm_destroy(comm), COMPCOLL_SUCCESS);
  std::filesystem::remove_all(dir);
}

TEST(CApi, ALaunchersBadRankIsNamedAsTheLauncherSetIt) {
  compcoll_comm_t* comm = nullptr;
  {
    const ScopedEnv env({{"RANK", "5"}, {"WORLD_SIZE", "4"}, {"COMPCOLL_RENDEZVOUS", "file:///x"}});
    EXPECT_EQ(compcoll_comm_create_from_env(&comm), COMPCOLL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(compcoll_last_error()).find("RANK=5 is not below WORLD_SIZE=4"),
              std::string::npos)
        << compcoll_last_error();
    EXPECT_EQ(std::string(compcoll_last_error()).find("COMPCOLL_RANK"), std::string::npos)
        << compcoll_last_error();
  }
  {
    const ScopedEnv env({{"RANK", "abc"}, {"WORLD_SIZE", "4"}, {"COMPCOLL_RENDEZVOUS", "file:///x"}});
    EXPECT_EQ(compcoll_comm_create_from_env(&comm), COMPCOLL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(compcoll_last_error()).find("(read from RANK, since COMPCOLL_RANK is unset)"),
              std::string::npos)
        << compcoll_last_error();
  }
  EXPECT_EQ(comm, nullptr);
}

// Rank 0's first thread is inside its second allreduce, waiting for rank 1,
// which makes that call only once rank 0's second thread is done.
TEST(CApi, AnotherThreadsStateCallsAndDestroyAreRefusedDuringACallAndStatsStayReadable) {
  const std::string dir = make_dir();
  const ScopedEnv env({{"COMPCOLL_ALGO", "dgc"},
                       {"COMPCOLL_MIN_ELEMS", "1000"},
                       {"COMPCOLL_WARMUP_STEPS", "0"},
                       {"COMPCOLL_TIMEOUT_MS", "30000"}});
  constexpr size_t kCount = 20000;
  std::atomic<bool> checked{false}, rank0_inside{false};
  with_two_ranks(dir, [&](int rank, compcoll_comm_t* comm) {
    std::vector<float> g(kCount, 0.5f + float(rank));
    ASSERT_EQ(compcoll_allreduce(comm, g.data(), kCount, COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
              COMPCOLL_SUCCESS)
        << compcoll_last_error();
    if (rank == 0) {
      std::thread other([&] {
        // Bounded: the first thread enters its call well within it.
        for (int i = 0; i < 200 && !rank0_inside.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        size_t rescaled = 77;
        EXPECT_EQ(compcoll_rescale_state(comm, 0.5, &rescaled), COMPCOLL_INVALID_ARGUMENT);
        EXPECT_NE(std::string(compcoll_last_error())
                      .find("rescale_state entered this communicator while another of its "
                            "calls was running on another thread"),
                  std::string::npos)
            << compcoll_last_error();
        EXPECT_EQ(rescaled, 77u) << "untouched by a refused call";
        EXPECT_EQ(compcoll_set_loss_scaled(comm, 1), COMPCOLL_INVALID_ARGUMENT);
        // A destroy is refused too, and frees nothing: it crashed the
        // running call (use after free) when it went through.
        EXPECT_EQ(compcoll_comm_destroy(comm), COMPCOLL_INVALID_ARGUMENT);
        EXPECT_NE(std::string(compcoll_last_error())
                      .find("compcoll_comm_destroy entered while a call of this communicator "
                            "was running on another thread; nothing was freed"),
                  std::string::npos)
            << compcoll_last_error();
        compcoll_stats_t s{};
        EXPECT_EQ(compcoll_get_stats(comm, &s), COMPCOLL_SUCCESS);
        EXPECT_EQ(s.calls, 1u) << "as of the last finished call";
        EXPECT_EQ(s.compressed_calls, 1u);
        EXPECT_GT(s.state_bytes, 0u);
        compcoll_steady_stats_t st{};
        EXPECT_EQ(compcoll_get_steady_stats(comm, &st), COMPCOLL_SUCCESS);
        EXPECT_EQ(st.steady_calls, 1u);
        checked = true;
      });
      rank0_inside = true;
      EXPECT_EQ(compcoll_allreduce(comm, g.data(), kCount, COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
                COMPCOLL_SUCCESS)
          << compcoll_last_error();
      other.join();
      // Between calls, the same calls are taken.
      EXPECT_EQ(compcoll_rescale_state(comm, 1.0, nullptr), COMPCOLL_SUCCESS)
          << compcoll_last_error();
      compcoll_stats_t s{};
      EXPECT_EQ(compcoll_get_stats(comm, &s), COMPCOLL_SUCCESS);
      EXPECT_EQ(s.calls, 2u);
    } else {
      for (int i = 0; i < 2000 && !checked.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_TRUE(checked.load()) << "rank 0's second thread never finished its checks";
      EXPECT_EQ(compcoll_allreduce(comm, g.data(), kCount, COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
                COMPCOLL_SUCCESS)
          << compcoll_last_error();
    }
  });
  std::filesystem::remove_all(dir);
}

// A failed communicator refuses every further call, the loss scaler's
// too (compcoll_rescale_state and compcoll_set_loss_scaled answered success
// on it, which the header's "refuses further calls" rules out); destroy
// still frees it.
TEST(CApi, AFailedCommunicatorRefusesTheLossScalersCallsToo) {
  const std::string dir = make_dir();
  const ScopedEnv env({{"COMPCOLL_ALGO", "dgc"},
                       {"COMPCOLL_MIN_ELEMS", "1000"},
                       {"COMPCOLL_TIMEOUT_MS", "1500"}});
  with_two_ranks(dir, [&](int rank, compcoll_comm_t* comm) {
    if (rank == 0) {  // its peer never calls: the call times out
      std::vector<float> g(20000, 1.0f);
      EXPECT_EQ(compcoll_allreduce(comm, g.data(), g.size(), COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
                COMPCOLL_TRANSPORT_ERROR);
      for (const compcoll_status_t s :
           {compcoll_rescale_state(comm, 0.5, nullptr), compcoll_set_loss_scaled(comm, 1)}) {
        EXPECT_EQ(s, COMPCOLL_TRANSPORT_ERROR);
        EXPECT_NE(std::string(compcoll_last_error())
                      .find("this communicator failed earlier and must be rebuilt"),
                  std::string::npos)
            << compcoll_last_error();
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(4000));
    }
  });
  std::filesystem::remove_all(dir);
}

// Two live communicators of one process with the same rank (one per
// thread, as the header suggests): the second writes its stats beside the
// first's instead of over it (the file kept only the last destroyed).
TEST(CApi, TwoCommunicatorsOfOneRankWriteTwoStatsFiles) {
  const std::string dir = make_dir();
  const ScopedEnv env({{"COMPCOLL_ALGO", "dgc"},
                       {"COMPCOLL_MIN_ELEMS", "1000"},
                       {"COMPCOLL_STATS_FILE", dir + "/stats-{rank}.json"}});
  compcoll_comm_t* a = nullptr;
  compcoll_comm_t* b = nullptr;
  ASSERT_EQ(compcoll_comm_create(("file://" + dir + "/a").c_str(), 0, 1, &a), COMPCOLL_SUCCESS)
      << compcoll_last_error();
  ASSERT_EQ(compcoll_comm_create(("file://" + dir + "/b").c_str(), 0, 1, &b), COMPCOLL_SUCCESS)
      << compcoll_last_error();
  std::vector<float> g(4000, 1.0f);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(compcoll_allreduce(a, g.data(), g.size(), COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
              COMPCOLL_SUCCESS);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(compcoll_allreduce(b, g.data(), g.size(), COMPCOLL_FLOAT32, COMPCOLL_SUM, "w"),
              COMPCOLL_SUCCESS);
  }
  ASSERT_EQ(compcoll_comm_destroy(b), COMPCOLL_SUCCESS);
  ASSERT_EQ(compcoll_comm_destroy(a), COMPCOLL_SUCCESS);
  const auto calls_in = [](const std::string& path) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"calls\": ");
    return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + 9);
  };
  EXPECT_EQ(calls_in(dir + "/stats-0.json"), 5);
  EXPECT_EQ(calls_in(dir + "/stats-0-comm2.json"), 2);
  // Once both are gone, a new communicator takes the plain name again.
  compcoll_comm_t* c = nullptr;
  ASSERT_EQ(compcoll_comm_create(("file://" + dir + "/c").c_str(), 0, 1, &c), COMPCOLL_SUCCESS);
  ASSERT_EQ(compcoll_comm_destroy(c), COMPCOLL_SUCCESS);
  EXPECT_EQ(calls_in(dir + "/stats-0.json"), 0);
  std::filesystem::remove_all(dir);
}

// compcoll_comm_create's failures all leave *comm NULL, and an empty
// rendezvous is named as the argument it is, not as an unset variable.
TEST(CApi, CreateFailuresLeaveNullAndNameTheArgument) {
  compcoll_comm_t* comm = reinterpret_cast<compcoll_comm_t*>(0x1);
  EXPECT_EQ(compcoll_comm_create(nullptr, 0, 1, &comm), COMPCOLL_INVALID_ARGUMENT);
  EXPECT_EQ(comm, nullptr);
  comm = reinterpret_cast<compcoll_comm_t*>(0x1);
  EXPECT_EQ(compcoll_comm_create("", 0, 1, &comm), COMPCOLL_INVALID_ARGUMENT);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(compcoll_last_error()).find("compcoll_comm_create: the rendezvous is empty"),
            std::string::npos)
      << compcoll_last_error();
  int size = 0;
  EXPECT_EQ(compcoll_comm_size(nullptr, &size), COMPCOLL_INVALID_ARGUMENT);
  EXPECT_STRNE(compcoll_last_error(), "");
  // An interface and an address for the tcp device: refused before any
  // rendezvous, naming both variables (the device's own words named neither).
  {
    const std::string dir = make_dir();
    const ScopedEnv env({{"COMPCOLL_IFACE", "lo"}, {"COMPCOLL_HOSTNAME", "127.0.0.1"}});
    comm = reinterpret_cast<compcoll_comm_t*>(0x1);
    EXPECT_EQ(compcoll_comm_create(("file://" + dir).c_str(), 0, 1, &comm),
              COMPCOLL_INVALID_ARGUMENT);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(compcoll_last_error())
                  .find("COMPCOLL_IFACE=lo and COMPCOLL_HOSTNAME=127.0.0.1 are both set"),
              std::string::npos)
        << compcoll_last_error();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
