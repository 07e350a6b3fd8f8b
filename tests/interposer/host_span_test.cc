// COMPCOLL_NCCL_COMMS=multi-host's exchange of host ids over the NCCL
// transport (the stand-in NCCL, ranks as threads, hosts emulated with a host
// id per rank, as COMPCOLL_HOST_ID gives one per process).
#include <gtest/gtest.h>

#include "collectives/agreement.h"

#include <span>
#include <string>

#include "plugin/nccl_interposer/host_span.h"
#include "tests/interposer/standin.h"

namespace compcoll {
namespace {

using interposer::exchange_host_span;
using interposer::HostSpan;

constexpr auto kTimeout = std::chrono::milliseconds(20000);

TEST(NcclHostSpan, RanksOnSeveralHostsSpanThemAndRanksOnOneDoNot) {
  for (const int per_host : {1, 2, 3, 4}) {  // 4 ranks: 4, 2, 2 (3 + 1) and 1 host
    std::vector<std::string> described(4);
    std::vector<int> several(4, -1);
    const auto errors = testing::run_nccl_ranks(4, kTimeout, [&](nccl::NcclComm& c) {
      const HostSpan span = exchange_host_span(c, "node-" + std::to_string(c.rank() / per_host));
      EXPECT_EQ(span.undetected, "");
      described[size_t(c.rank())] = span.layout.describe();
      several[size_t(c.rank())] = span.several_hosts();
    });
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << per_host << " rank " << r;
    const std::string want = per_host == 1   ? "4 hosts: {0} {1} {2} {3}"
                             : per_host == 2 ? "2 hosts: {0,1} {2,3}"
                             : per_host == 3 ? "2 hosts: {0,1,2} {3}"
                                             : "1 host: {0,1,2,3}";
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(described[size_t(r)], want) << per_host << " per host, rank " << r;
      EXPECT_EQ(several[size_t(r)], per_host < 4) << per_host << " per host, rank " << r;
    }
  }
}

TEST(NcclHostSpan, ARankOutsideTheExchangeIsNamedAndItNamesTheOthers) {
  // Rank 2 runs with COMPCOLL_NCCL_COMMS=all: its first collective is its
  // Communicator's agreement on the configuration (a real description is a
  // few hundred bytes, more than a host id), not the host ids. Each side
  // names the other instead of refusing its part as oversized or parsing
  // it as something it is not.
  std::vector<std::string> seen(3);
  std::string description;
  for (int i = 0; description.size() < 600; ++i) description += "setting" + std::to_string(i) + "=1;";
  const auto errors = testing::run_nccl_ranks(3, kTimeout, [&](nccl::NcclComm& c) {
    try {
      if (c.rank() == 2) {
        ensure_agreement(c, description);
      } else {
        exchange_host_span(c, "node-0");
      }
    } catch (const Error& e) {
      seen[size_t(c.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(seen[size_t(r)].find("rank 2 did not take part in COMPCOLL_NCCL_COMMS=multi-host"),
              std::string::npos) << seen[size_t(r)];
    EXPECT_NE(seen[size_t(r)].find("must be the same on every rank"), std::string::npos);
  }
  EXPECT_NE(seen[2].find("rank(s) 0, 1 did not take part in the agreement on the compression "
                         "configuration"),
            std::string::npos) << seen[2];
  EXPECT_NE(seen[2].find("COMPCOLL_NCCL_COMMS"), std::string::npos) << seen[2];
}

}  // namespace
}  // namespace compcoll
