// Rendezvous: spec parsing, deadlines, and real multi-process runs over a
// FileStore directory and a real redis-server on 127.0.0.1.
#include <gloo/rendezvous/hash_store.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "compcoll/error.h"
#include "tests/support/gloo_harness.h"
#include "tests/support/process_util.h"
#include "transport/gloo_connect.h"
#include "transport/rendezvous.h"

namespace compcoll {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using namespace compcoll::testing;

const std::string kPeer = COMPCOLL_TRANSPORT_PEER;

long long ms_since(steady_clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - t).count();
}

TEST(StoreSpec, ParsesFileAndRedisForms) {
  StoreSpec a = parse_store_spec("file:///tmp/some dir");
  EXPECT_EQ(a.kind, StoreSpec::Kind::kFile);
  EXPECT_EQ(a.path, "/tmp/some dir");
  EXPECT_EQ(parse_store_spec("file://relative/dir").path, "relative/dir");
  StoreSpec r = parse_store_spec("redis://127.0.0.1:6379");
  EXPECT_EQ(r.kind, StoreSpec::Kind::kRedis);
  EXPECT_EQ(r.host, "127.0.0.1");
  EXPECT_EQ(r.port, 6379);
  StoreSpec v6 = parse_store_spec("redis://[::1]:7000/");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 7000);
  EXPECT_EQ(v6.job, "");
  // redis://HOST:PORT/JOB: the job's own keys on a shared server.
  StoreSpec job = parse_store_spec("redis://127.0.0.1:6379/run-7.a_b/");
  EXPECT_EQ(job.host, "127.0.0.1");
  EXPECT_EQ(job.port, 6379);
  EXPECT_EQ(job.job, "run-7.a_b");
  EXPECT_EQ(parse_store_spec("redis://[::1]:7000/x").job, "x");
  for (const char* bad : {"redis://h:1/a/b", "redis://h:1/a b", "redis://h:1//"}) {
    try {
      parse_store_spec(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("job name"), std::string::npos) << e.what();
    }
  }
}

TEST(StoreSpec, MalformedSpecsNameTheValueAndTheAllowedForms) {
  for (const std::string bad :
       {"", "tcp://host:1", "/tmp/dir", "file://", "redis://", "redis://host",
        "redis://host:", "redis://host:0", "redis://host:65536", "redis://host:12ab",
        "redis://:6379", "redis://a:b:1", "redis://[::1]6379", "redis://us@r:1"}) {
    try {
      parse_store_spec(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("file://DIR"), std::string::npos) << msg;
      EXPECT_NE(msg.find("redis://HOST:PORT"), std::string::npos) << msg;
    }
  }
  // connect_gloo reports the same error before any traffic.
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.rendezvous = "redis:/127.0.0.1:6379";
  try {
    connect_gloo(o);
    ADD_FAILURE() << "accepted a malformed spec";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("redis:/127.0.0.1:6379"), std::string::npos);
  }
}

TEST(RendezvousStore, WaitEndsAtTheDeadlineToTheMillisecond) {
  TempDir dir;
  for (auto base : {make_store("file://" + dir.path()),
                    std::shared_ptr<gloo::rendezvous::Store>(
                        std::make_shared<gloo::rendezvous::HashStore>())}) {
    const auto start = steady_clock::now();
    RendezvousStore store(base, "p", start + milliseconds(300), milliseconds(300));
    store.set("present", {'x'});
    const auto missing = store.wait_for_all({"present", "absent"});
    const long long took = ms_since(start);
    ASSERT_EQ(missing, std::vector<std::string>{"p/absent"});
    EXPECT_GE(took, 290);
    EXPECT_LT(took, 700);  // Gloo's own FileStore wait would take 1-2 s
    EXPECT_EQ(store.get("present"), std::vector<char>{'x'});
    // wait() (what Gloo's connect calls) turns the same miss into an error
    // that is a timeout by type, carrying its limit, and names the key.
    try {
      store.wait({"absent"});
      ADD_FAILURE() << "wait() returned without the key";
    } catch (const TimeoutError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport);
      EXPECT_EQ(e.limit(), milliseconds(300));
      EXPECT_NE(std::string(e.what()).find("p/absent"), std::string::npos) << e.what();
    }
    try {
      store.set("present", {'y'});
      ADD_FAILURE() << "overwrote a key";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos);
    }
  }
}

TEST(Rendezvous, FileStoreWithRanksAsProcesses) {
  TempDir dir;
  ChildSet children;
  const int world = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(children.add(spawn(
        {kPeer, "--rank", std::to_string(r), "--size", std::to_string(world),
         "--rendezvous", "file://" + dir.path() + "/store", "--timeout-ms", "20000",
         "--mode", "check"},
        dir.path() + "/out" + std::to_string(r))));
  }
  for (int r = 0; r < world; ++r) {
    const auto status = children.wait(pids[static_cast<size_t>(r)], milliseconds(30000));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " still running";
    const std::string out = read_file(dir.path() + "/out" + std::to_string(r));
    EXPECT_EQ(exit_code(*status), 0) << out;
    EXPECT_NE(out.find("OK rank " + std::to_string(r)), std::string::npos) << out;
  }
}

TEST(Rendezvous, FileStoreSharedByThreadsWithTwoPrefixes) {
  TempDir dir;
  HarnessOptions o;
  o.store = make_store("file://" + dir.path());
  for (const char* prefix : {"first", "second"}) {
    o.prefix = prefix;
    run_gloo_ranks(3, [](Comm& comm) {
      int x = comm.rank();
      comm.allreduce(&x, 1, DType::kInt32, ReduceOp::kMax);
      EXPECT_EQ(x, 2);
    }, o);
  }
  // Reusing a prefix is refused clearly instead of mixing two generations.
  o.prefix = "first";
  try {
    run_gloo_ranks(3, [](Comm&) {}, o);
    ADD_FAILURE() << "prefix reuse accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
}

// A real redis-server on a free loopback port, stopped on destruction.
class RedisServer {
 public:
  explicit RedisServer(const std::string& binary) : port_(free_loopback_port()) {
    pid_ = children_.add(spawn({binary, "--port", std::to_string(port_), "--bind",
                                "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--daemonize", "no"},
                               dir_.path() + "/redis.log"));
    const auto deadline = steady_clock::now() + milliseconds(10000);
    while (!port_accepts(port_) && steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  ~RedisServer() {
    kill(pid_, SIGTERM);
    if (!children_.wait(pid_, milliseconds(5000))) children_.kill_all();
  }
  bool up() const { return port_accepts(port_); }
  std::string spec() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_file(dir_.path() + "/redis.log"); }

 private:
  TempDir dir_;
  ChildSet children_;
  int port_;
  pid_t pid_ = -1;
};

TEST(Rendezvous, RedisStoreWithRanksAsProcesses) {
  const std::string binary = find_in_path("redis-server");
  if (binary.empty()) GTEST_SKIP() << "redis-server is not installed (apt install redis-server)";
  RedisServer redis(binary);
  ASSERT_TRUE(redis.up()) << redis.log();

  TempDir dir;
  ChildSet children;
  const int world = 4;
  for (const std::string prefix : {"job1", "job2"}) {  // one server, two jobs
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pids.push_back(children.add(spawn(
          {kPeer, "--rank", std::to_string(r), "--size", std::to_string(world),
           "--rendezvous", redis.spec(), "--prefix", prefix, "--timeout-ms", "20000",
           "--mode", "check"},
          dir.path() + "/" + prefix + std::to_string(r))));
    }
    for (int r = 0; r < world; ++r) {
      const auto status = children.wait(pids[static_cast<size_t>(r)], milliseconds(30000));
      ASSERT_TRUE(status.has_value()) << "rank " << r << " still running";
      const std::string out = read_file(dir.path() + "/" + prefix + std::to_string(r));
      EXPECT_EQ(exit_code(*status), 0) << out;
      EXPECT_NE(out.find("OK rank"), std::string::npos) << out;
    }
  }
  // Threads over the same server, and a prefix reused by mistake.
  HarnessOptions o;
  o.store = make_store(redis.spec());
  o.prefix = "threads";
  run_gloo_ranks(2, [](Comm& comm) { comm.barrier(); }, o);
  o.store = make_store(redis.spec());
  o.prefix = "job1";
  EXPECT_THROW(run_gloo_ranks(2, [](Comm&) {}, o), Error);

  // What a user writes: redis://HOST:PORT/JOB, one name per job on one
  // server; a name reused is refused with that advice.
  const auto connect_pair = [&](const std::string& spec) {
    std::vector<std::string> errors(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) {
      ts.emplace_back([&, r] {
        GlooOptions g;
        g.rank = r;
        g.size = 2;
        g.rendezvous = spec;
        g.timeout = milliseconds(5000);
        try {
          connect_gloo(g)->barrier();
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    return errors;
  };
  for (const std::string job : {"/jobA", "/jobB"}) {
    for (const std::string& e : connect_pair(redis.spec() + job)) EXPECT_EQ(e, "") << job;
  }
  for (const std::string& e : connect_pair(redis.spec() + "/jobA")) {
    EXPECT_NE(e.find("a redis://HOST:PORT/JOB name of its own"), std::string::npos) << e;
  }
}

TEST(Rendezvous, UnreachableRedisIsATransportError) {
  const int port = free_loopback_port();  // nobody listens there
  const auto start = steady_clock::now();
  try {
    make_store("redis://127.0.0.1:" + std::to_string(port), milliseconds(1000));
    ADD_FAILURE() << "connected to a closed port";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTransport);
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(ms_since(start), 3000);
}

// A listener on the redis:// port that is no redis-server: one that answers
// something else (an HTTP server), one that never answers. Each is a
// transport error naming the setting within the limit, not an internal one.
TEST(Rendezvous, AServerThatIsNotRedisIsATransportErrorNamingTheSetting) {
  for (const bool answers : {true, false}) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(listener, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    ASSERT_EQ(listen(listener, 4), 0);
    std::thread server([listener, answers] {
      const int c = accept(listener, nullptr, nullptr);
      if (c < 0) return;
      if (answers) {
        const char reply[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
        (void)!write(c, reply, sizeof reply - 1);
      }
      char buf[256];
      while (read(c, buf, sizeof buf) > 0) {  // until the client gives up and closes
      }
      close(c);
    });
    const auto start = steady_clock::now();
    try {
      RendezvousStore store(
          make_store("redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), milliseconds(800)),
          "p", start + milliseconds(800), milliseconds(800));
      store.set("k", {'1'});
      ADD_FAILURE() << "a store that is not redis accepted a key";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport) << e.what();
      EXPECT_NE(std::string(e.what()).find("did not answer as a redis-server"), std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a compcoll error: " << e.what();
    }
    EXPECT_LT(ms_since(start), 5000) << (answers ? "answering" : "silent");
    shutdown(listener, SHUT_RDWR);
    close(listener);
    server.join();
  }
}

}  // namespace
}  // namespace compcoll
