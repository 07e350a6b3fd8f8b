// FailureBoard: what the ranks of a group tell each other when it fails, so
// that an error names the rank that is gone or stuck.
//
// Why. Torch's Gloo reports a dead peer by address ("Connection reset by
// peer [10.0.0.7]:41235"), never by rank, and a stuck peer (SIGSTOP, a hang
// in user code) not at all: every other rank waits out the group's timeout,
// 30 minutes by default, and then says only that it waited. compcoll's own
// Gloo transport (the C API, the benchmark) knows which rank each socket
// leads to; through torch's process group that map is out of reach. The
// group's store is not: every rank of the group can reach it.
//
// Keys (on the group's store, under the group's prefix):
//   compcoll_board/who/<r>    set at creation: "pid P on host H"
//   compcoll_board/count      failures posted so far (store add)
//   compcoll_board/post/<n>   the n-th: "<rank>\t<failed|followed>\t<text>"
// The count read at creation is this group's baseline: posts below it were
// left by an earlier group of the same name on a reused store.
//
// Protocol.
//   report()        A rank whose operation failed (a transport error, or its
//                   deadline) posts its failure once, then reads the others'
//                   posts until every rank has posted or listen_for() has
//                   passed (a tenth of the failed operation's timeout,
//                   between check_every() + 0.5 s, so that ranks that only
//                   wait are heard from, and check_every() + 2.5 s: 1 s to
//                   3 s up to 32 ranks; a failure's error comes that much
//                   later, which a short timeout must not double), and
//                   returns a sentence for its error: who
//                   failed too, who stopped waiting because of a failure, and who
//                   posted nothing (gone: killed, crashed, its host down; or
//                   stuck), with their pid and host.
//   check_peers()   A rank still waiting in an operation reads the count
//                   (one store call) every check_every() once the operation
//                   is kCheckAfter old (the worker's watchdog does): every
//                   0.5 s up to 32 ranks, less often above (a rank 0 busy
//                   with an evaluation keeps the others waiting, and their
//                   reads all go to one store), at most every 5 s. A post by
//                   another rank ends the wait at once, as a "followed"
//                   failure: the group is unusable on the rank that failed
//                   (its communicator or its worker is broken), so what
//                   waits on that rank waits for nothing.
//
// Bounds. Every store call runs on a thread of its own and is given up after
// kStoreWait: the store's host may be the rank that is gone (rank 0 hosts it
// unless a launcher such as torchrun does), a stopped one, or one busy. A
// call that failed ends the board's use of the store; a call that did not
// answer in time is asked again once it has returned (one outstanding call
// at most). The sentence says which.
//
// A post counted and never set (its poster died between the two calls) is
// skipped after a second, so it cannot hide the posts after it.
//
// Thread-safe: one call at a time (a second report() waits for the first,
// which is bounded, and returns its answer).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "integration/pytorch/csrc/group_timeout.h"

namespace compcoll::torch_integration {

class FailureBoard {
 public:
  static constexpr std::chrono::milliseconds kCheckAfter{500};
  static constexpr std::chrono::milliseconds kStoreWait{2000};

  // A failure another rank posted: its rank and what it said.
  struct Post {
    int rank = -1;
    bool followed = false;  // it stopped waiting because of another's failure
    std::string text;
  };

  // Posts this rank's identity and reads the baseline (bounded store calls;
  // a store that fails leaves a board that says so when asked). timeout:
  // the group's (get(): an operation's own on a thread running it).
  FailureBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
               std::shared_ptr<const GroupTimeout> timeout);

  // This rank's failure (`followed`: it stopped waiting because of another
  // rank's). Posts it, the first time, and returns what the board says of
  // the other ranks: a sentence to append to the error (never empty when
  // the group has other ranks). Blocks at most listen_for(timeout) + 3
  // kStoreWait on the first call; later calls return the first call's
  // answer at once. timeout: the failed operation's (zero: the timeout's
  // get() on this thread).
  std::string report(const std::string& failure, bool followed = false,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // The first failure another rank posted since this group was created, if
  // any (one bounded store call when no post is known yet).
  std::optional<Post> check_peers();
  // This rank's own post, if it made one (report()).
  std::optional<Post> own_post();

  // The process is exiting (the backend's exit hook, shutdown, destruction):
  // from now on nothing is posted or read (report() returns "" at once), as
  // nobody listens any more and the store's host may be gone already (its
  // client then printed torch's stack trace at a normal exit). Any thread;
  // never blocks.
  void close() { closed_.store(true); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  // How often a waiting rank reads the board, and how long a rank whose
  // operation of `timeout` failed listens for the others' posts (see
  // report() above).
  std::chrono::milliseconds check_every() const;
  std::chrono::milliseconds listen_for(std::chrono::milliseconds timeout) const;

 private:
  // Under mu_. fn(store) run on a thread of its own (fn must own what it
  // touches: it may outlive the call); nullopt, and the store marked
  // unusable with why, when it threw or did not return within kStoreWait.
  template <typename R>
  std::optional<R> call_store(const char* what, std::function<R(c10d::Store&)> fn);
  // Reads the posts after read_up_to_ not read yet into posts_ (store calls).
  void read_posts();
  std::string summary(std::chrono::milliseconds listened) const;  // posts_, who_, store_error_
  // Under mu_: the identity (pid and host) of a few ranks that have not
  // posted and are not known yet (one bounded store call).
  void read_who();

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  const std::shared_ptr<const GroupTimeout> timeout_;

  std::mutex mu_;  // guards everything below; held through each public call
  // Posts read so far (absolute numbers): from the count at creation, the
  // baseline (posts below it are an earlier group's).
  int64_t read_up_to_ = 0;
  std::map<int, Post> posts_;   // by rank, first post of each; this rank's too
  std::map<int, std::string> who_;
  std::string store_error_;     // "" while no store call failed; then never asked again
  std::string store_slow_;      // the last call that did not answer in time ("" once one did)
  std::function<bool()> outstanding_;  // whether that call has returned since
  bool posts_read_ = false;     // the posts were read at least once
  std::set<int64_t> read_ahead_;  // posts read beyond read_up_to_
  std::map<int64_t, std::chrono::steady_clock::time_point> holes_;  // counted, unset: since
  std::optional<std::string> answer_;  // report()'s, once known
  std::atomic<bool> closed_{false};    // close(); read without mu_
};

// error followed by the board's account of the other ranks (report()) as
// its next sentence; error alone when the account is empty.
std::string with_account(std::string error, const std::string& account);

}  // namespace compcoll::torch_integration
