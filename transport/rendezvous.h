// Rendezvous: how ranks find each other before they can talk.
//
// A rendezvous store is a Gloo key/value store shared by all ranks:
//   file://DIR        gloo FileStore: DIR is a directory every rank can read
//                     and write (a shared filesystem across hosts). Created
//                     when missing. "file:///abs/dir" and "file://rel/dir".
//   redis://HOST:PORT gloo RedisStore on a running redis-server. IPv6 hosts
//                     are written in brackets: redis://[::1]:6379.
// or, in code, any gloo::rendezvous::Store (HashStore for threads of one
// process, PrefixStore, a user's own).
//
// Gloo's stores block forever or round their timeouts to whole seconds;
// RendezvousStore puts a namespace (prefix) and one hard deadline over any
// store so that a rendezvous ends on time with a message naming the ranks
// that never showed up.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace compcoll {

struct StoreSpec {
  enum class Kind { kFile, kRedis };
  Kind kind = Kind::kFile;
  std::string path;  // kFile
  std::string host;  // kRedis
  int port = 0;      // kRedis
  // kRedis: redis://HOST:PORT/JOB puts the job's keys under JOB, so that
  // jobs can share one redis-server (keys are never deleted: a name serves
  // one job, as a file:// directory does). Empty: no name.
  std::string job;
};

// Parses a rendezvous spec. Throws Error(kInvalidArgument) naming the value
// and the accepted forms when it is malformed.
StoreSpec parse_store_spec(const std::string& spec);

// Opens the store a spec names. `timeout` bounds the Redis connect and every
// Redis command. The store is safe to share between threads (ranks that are
// threads of one process), and its waits end to the millisecond. Throws kInvalidArgument for a bad spec or an unusable
// directory, kTransport when the Redis server cannot be reached.
std::shared_ptr<gloo::rendezvous::Store> make_store(
    const std::string& spec,
    std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A view of `base` in which every key is "<prefix>/<key>" (no prefix when
// empty) and every wait ends at `deadline`, to the millisecond, whatever
// timeout the caller passes. Stores from make_store and Gloo's RedisStore
// are polled directly; other stores get the time left as their wait timeout
// (a plain gloo FileStore, e.g. under a user's PrefixStore, rounds that up to
// whole seconds: prefer make_store). Timeouts throw Error(kTransport) listing
// the keys still missing.
class RendezvousStore : public gloo::rendezvous::Store {
 public:
  // `limit` is the timeout the deadline was derived from; a wait that
  // passes the deadline throws a TimeoutError carrying it.
  RendezvousStore(std::shared_ptr<gloo::rendezvous::Store> base,
                  std::string prefix,
                  std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds limit);

  // Refuses (kInvalidArgument) to overwrite a key that already exists, which
  // happens when two communicators share a prefix or a rank is started twice.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Waits until all keys exist or the deadline passes; returns the keys still
  // missing (empty on success). Never throws for a timeout.
  std::vector<std::string> wait_for_all(const std::vector<std::string>& keys);

  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const;
  // Whether `key` (already prefixed) exists, without blocking beyond ~1 ms.
  bool exists(const std::string& full_key);

  std::shared_ptr<gloo::rendezvous::Store> base_;
  std::string prefix_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds limit_;
};

}  // namespace compcoll
