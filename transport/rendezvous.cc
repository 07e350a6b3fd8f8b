#include "transport/rendezvous.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "compcoll/error.h"

namespace compcoll {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

constexpr const char* kSpecForms =
    "expected file://DIR (a directory shared by all ranks) or "
    "redis://HOST:PORT[/JOB] (a running redis-server; JOB names this job's keys)";

// Stores whose key existence can be polled without blocking, so waits can
// end to the millisecond (Gloo's own waits compare whole seconds).
class Pollable {
 public:
  virtual ~Pollable() = default;
  virtual bool has_keys(const std::vector<std::string>& keys) = 0;
};

// Polls has_keys every 10 ms until all exist or `timeout` passes.
void poll_wait(Pollable& store, const std::vector<std::string>& keys,
               milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  while (!store.has_keys(keys)) {
    if (steady_clock::now() >= deadline) {
      throw gloo::IoException(detail::concat(
          "Wait timeout after ", timeout.count(), " ms for key(s): ",
          gloo::MakeString(keys)));
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// Gloo's FileStore and RedisStore are not thread-safe (the RedisStore shares
// one hiredis connection, the FileStore appends to a vector), yet the
// stores make_store returns may be shared by ranks that are threads. Every
// operation therefore takes a per-store lock; recursive because Gloo's get()
// calls wait(), which lands back here.
template <typename GlooStore>
class LockedStore : public GlooStore, public Pollable {
 public:
  template <typename... Args>
  explicit LockedStore(Args&&... args) : GlooStore(std::forward<Args>(args)...) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard<std::recursive_mutex> lock(m_);
    GlooStore::set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    std::lock_guard<std::recursive_mutex> lock(m_);
    return GlooStore::get(key);
  }
  bool has_keys(const std::vector<std::string>& keys) override {
    std::lock_guard<std::recursive_mutex> lock(m_);
    return this->check(keys);
  }
  // Polls without holding the lock between checks.
  void wait(const std::vector<std::string>& keys) override {
    poll_wait(*this, keys, gloo::rendezvous::Store::kDefaultTimeout);
  }
  void wait(const std::vector<std::string>& keys,
            const milliseconds& timeout) override {
    poll_wait(*this, keys, timeout);
  }

 protected:
  std::recursive_mutex m_;
};

using FileStore = LockedStore<gloo::rendezvous::FileStore>;

class RedisStore final : public LockedStore<gloo::rendezvous::RedisStore> {
 public:
  RedisStore(const std::string& host, int port, milliseconds timeout)
      : LockedStore<gloo::rendezvous::RedisStore>(host, port) {
    // Gloo leaves hiredis commands without a timeout; a stalled server would
    // block a rank forever.
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    redisSetTimeout(redis_, tv);
  }
};

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

StoreSpec parse_store_spec(const std::string& spec) {
  StoreSpec out;
  const std::string file = "file://";
  const std::string redis = "redis://";
  if (spec.rfind(file, 0) == 0) {
    out.kind = StoreSpec::Kind::kFile;
    out.path = spec.substr(file.size());
    CC_CHECK(!out.path.empty(), kInvalidArgument, "rendezvous spec '", spec,
             "' has no directory: ", kSpecForms);
    return out;
  }
  if (spec.rfind(redis, 0) == 0) {
    out.kind = StoreSpec::Kind::kRedis;
    std::string rest = spec.substr(redis.size());
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    // Neither a host nor an [IPv6] address holds a '/': what follows the
    // first one is the job's name.
    if (const size_t slash = rest.find('/'); slash != std::string::npos) {
      out.job = rest.substr(slash + 1);
      rest.resize(slash);
      CC_CHECK(!out.job.empty() && out.job.size() <= 200 &&
                   std::all_of(out.job.begin(), out.job.end(),
                               [](unsigned char c) {
                                 return std::isalnum(c) != 0 || c == '_' || c == '-' || c == '.';
                               }),
               kInvalidArgument, "rendezvous spec '", spec, "' has job name '", out.job,
               "': use 1 to 200 letters, digits, '_', '-' or '.': ", kSpecForms);
    }
    size_t colon;
    if (!rest.empty() && rest.front() == '[') {  // [v6addr]:port
      const size_t close = rest.find(']');
      CC_CHECK(close != std::string::npos && close + 1 < rest.size() &&
                   rest[close + 1] == ':',
               kInvalidArgument, "rendezvous spec '", spec,
               "' has a malformed [IPv6]:PORT part: ", kSpecForms);
      out.host = rest.substr(1, close - 1);
      colon = close + 1;
    } else {
      colon = rest.rfind(':');
      CC_CHECK(colon != std::string::npos, kInvalidArgument,
               "rendezvous spec '", spec, "' has no port: ", kSpecForms);
      out.host = rest.substr(0, colon);
    }
    const std::string port = rest.substr(colon + 1);
    const bool bracketed = !rest.empty() && rest.front() == '[';
    CC_CHECK(!out.host.empty() &&
                 (bracketed || out.host.find_first_of("/:@ ") == std::string::npos),
             kInvalidArgument, "rendezvous spec '", spec,
             "' has no valid host (IPv6 addresses go in brackets): ", kSpecForms);
    const bool digits =
        !port.empty() && port.size() <= 5 &&
        std::all_of(port.begin(), port.end(),
                    [](unsigned char c) { return std::isdigit(c) != 0; });
    out.port = digits ? std::stoi(port) : 0;
    CC_CHECK(out.port >= 1 && out.port <= 65535, kInvalidArgument,
             "rendezvous spec '", spec, "' has port '", port,
             "', which is not a number in 1..65535: ", kSpecForms);
    return out;
  }
  CC_THROW(kInvalidArgument, "rendezvous spec '", spec,
           "' is not recognised: ", kSpecForms);
}

std::shared_ptr<gloo::rendezvous::Store> make_store(const std::string& spec,
                                                    milliseconds timeout) {
  const StoreSpec s = parse_store_spec(spec);
  if (s.kind == StoreSpec::Kind::kFile) {
    std::error_code ec;
    std::filesystem::create_directories(s.path, ec);
    CC_CHECK(std::filesystem::is_directory(s.path), kInvalidArgument,
             "rendezvous spec '", spec, "': '", s.path,
             "' is not a directory and cannot be created",
             ec ? ": " + ec.message() : std::string());
    try {
      return std::make_shared<FileStore>(s.path);
    } catch (const std::exception& e) {
      CC_THROW(kInvalidArgument, "rendezvous spec '", spec,
               "': cannot use directory '", s.path, "': ", e.what());
    }
  }
  try {
    return std::make_shared<RedisStore>(s.host, s.port, timeout);
  } catch (const std::exception& e) {
    CC_THROW(kTransport, "rendezvous spec '", spec,
             "': cannot reach redis-server at ", s.host, ":", s.port, ": ",
             e.what());
  }
}

RendezvousStore::RendezvousStore(std::shared_ptr<gloo::rendezvous::Store> base,
                                 std::string prefix,
                                 steady_clock::time_point deadline,
                                 milliseconds limit)
    : base_(std::move(base)), prefix_(std::move(prefix)), deadline_(deadline), limit_(limit) {
  CC_CHECK(base_ != nullptr, kInvalidArgument,
           "RendezvousStore needs a store, got null");
}

std::string RendezvousStore::full(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "/" + key;
}

bool RendezvousStore::exists(const std::string& full_key) {
  const bool redis = dynamic_cast<gloo::rendezvous::RedisStore*>(base_.get()) != nullptr;
  try {
    if (auto* p = dynamic_cast<Pollable*>(base_.get())) return p->has_keys({full_key});
    if (redis) return static_cast<gloo::rendezvous::RedisStore*>(base_.get())->check({full_key});
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Connected, yet no redis answer: another server on that port, or one
    // that never replies (Gloo's socket timeout is the rendezvous limit).
    if (redis) {
      CC_THROW(kTransport, "rendezvous store: the redis:// server of COMPCOLL_RENDEZVOUS did not "
               "answer as a redis-server (checking key '", full_key, "'; no reply within ",
               limit_.count(), " ms, or a reply that is not redis's): ", e.what());
    }
    CC_THROW(kTransport, "rendezvous store: checking key '", full_key, "' failed: ", e.what());
  }
  try {
    base_->wait({full_key}, milliseconds(1));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string k = full(key);
  // A HashStore answers get() of a missing key with an empty value at once;
  // for the others exists() is a cheap poll.
  CC_CHECK(!exists(k), kInvalidArgument, "rendezvous key '", k,
           "' already exists in the store: an earlier job or communicator met in the same "
           "place (give each job a fresh file:// directory, or a redis://HOST:PORT/JOB name of "
           "its own, or remove the old one's files or keys), or two processes were started with "
           "the same rank");
  try {
    base_->set(k, data);
  } catch (const std::exception& e) {
    CC_THROW(kTransport, "rendezvous store: setting key '", k,
             "' failed: ", e.what());
  }
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  wait({key});
  try {
    return base_->get(full(key));
  } catch (const std::exception& e) {
    CC_THROW(kTransport, "rendezvous store: reading key '", full(key),
             "' failed: ", e.what());
  }
}

void RendezvousStore::wait(const std::vector<std::string>& keys) {
  const std::vector<std::string> missing = wait_for_all(keys);
  if (!missing.empty()) {
    CC_THROW_TIMEOUT(limit_, "rendezvous timed out after ", limit_.count(),
                     " ms waiting for key(s) ", describe_keys(missing),
                     " (a rank never joined, or joined with another prefix/store)");
  }
}

void RendezvousStore::wait(const std::vector<std::string>& keys,
                           const milliseconds& /*timeout*/) {
  // The caller's timeout is ignored on purpose: one deadline bounds the
  // whole rendezvous, however many waits it is made of.
  wait(keys);
}

std::vector<std::string> RendezvousStore::wait_for_all(
    const std::vector<std::string>& keys) {
  std::vector<std::string> pending;
  for (const auto& k : keys) pending.push_back(full(k));
  try {
    while (true) {
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [&](const std::string& k) { return exists(k); }),
                    pending.end());
      if (pending.empty() || steady_clock::now() >= deadline_) break;
      if (dynamic_cast<Pollable*>(base_.get()) != nullptr ||
          dynamic_cast<gloo::rendezvous::RedisStore*>(base_.get()) != nullptr) {
        std::this_thread::sleep_for(milliseconds(10));
        continue;
      }
      // Other stores (HashStore, PrefixStore, ...) block in their own wait;
      // give it the time left, then re-check what exists.
      const auto left = std::chrono::ceil<milliseconds>(deadline_ - steady_clock::now());
      try {
        base_->wait({pending.front()}, std::max(left, milliseconds(1)));
      } catch (const std::exception&) {
        // Timed out (or failed); the loop re-checks and ends at the deadline.
      }
    }
  } catch (const std::exception& e) {
    CC_THROW(kTransport, "rendezvous store: polling key(s) ",
             describe_keys(pending), " failed: ", e.what());
  }
  return pending;
}

}  // namespace compcoll
