// Worker: the thread that issues a compcoll backend's queued operations in
// submission order, and the deadline that bounds every one of them.
//
// Order. Gloo and NCCL match operations by the order in which they are
// issued, and every rank submits in the same order. The worker runs queued
// tasks first in, first out. A delegated operation may instead be issued by
// its caller when the worker is idle and nothing is queued (checked under
// the queue lock, and the worker takes nothing while the caller issues:
// run_now_if_idle), which is the same order.
//
// Callbacks. A queued operation's future is completed by the thread that
// finishes it, usually the worker, so its then() callbacks (DDP comm hooks
// such as PowerSGD's, which issue further collectives and wait for them) run
// on the worker. Queued behind the worker, an operation such a callback
// issues would wait for the thread that is waiting for it. So an operation
// submitted on the worker thread runs at once, there, nested in the one
// whose completion ran the callback: its place in the order is right after
// that operation, ahead of anything queued behind it. Every rank gets the
// same order whatever the timing, as long as each callback is attached
// before later operations are submitted (as DDP's hooks and
// `.get_future().then(cb)` chains do): attached before the operation
// completed, the callback runs on the worker right after it; attached after,
// it runs at once on the attaching thread, also before any later
// submission. (The order NCCL gives such chains: its futures complete at
// issue, so their callbacks run at once.)
//
// A callback may also wait for an operation submitted after the one it
// follows (w1.get_future().then(lambda f: w2.wait())): on the worker, w2's
// wait() runs the tasks queued ahead of w2, and w2's, there and then, in
// queue order (run_queued_through), so the worker never waits for itself.
// The order is the queue's, as on a rank whose callback ran on another
// thread. (A wait on w2's future, rather than on w2, is torch's and cannot
// do this: it holds the worker until the group's deadline, which fails it.)
//
// Deadlines. Every submitted operation must settle by its deadline,
// submission + the group's timeout at submission. A watchdog thread fails the first one
// that does not, whether it was queued (waiting for the worker), running on
// the worker, or issued to an inner backend and not yet completed, with a
// compcoll error naming the operation, the group and where it was stuck.
// The worker is then broken: this rank's order can no longer match the
// other ranks', so every other unsettled operation fails naming the first,
// queued tasks are dropped unrun and later submissions are refused. The
// watchdog runs no user code: failures, and so the futures' error
// callbacks, are delivered on a short-lived thread of their own.
//
// Peers' failures. With a failure board (failure_board.h), the watchdog
// reads it every FailureBoard::check_every() while the oldest unsettled
// operation is older than FailureBoard::kCheckAfter. When another rank has
// posted a failure (or this one has: a compressed allreduce that failed
// here leaves the worker usable), the group is unusable on that rank:
// every unsettled operation fails at once, naming it, as at a deadline
// (the worker is broken), instead of waiting out the timeout. A
// deadline's error, and these, end with what the board says of the other
// ranks (who failed too, who is gone or stuck).
//
// Lifetime. The Worker is shared with its two threads. stop() drains
// nothing (the backend drains first); it waits a bounded time for the
// worker thread and, if that thread is wedged (in a callback that never
// returns), detaches it: the thread keeps the Worker, and its task keeps
// what it captured, alive until it ends. Tasks must therefore own (or share)
// everything they touch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "integration/pytorch/csrc/failure_board.h"
#include "integration/pytorch/csrc/group_timeout.h"
#include "integration/pytorch/csrc/work.h"
#include "plugin/logging.h"

namespace compcoll::torch_integration {

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  using Task = std::function<void()>;
  using Clock = std::chrono::steady_clock;

  // A started worker for rank `rank` of a group of `size`.
  // timeout: the group's, read at each submission (dist.set_timeout moves
  // it; an operation submitted after a shortening wakes the watchdog when
  // its deadline falls before the watchdog's next wake-up).
  // board: the group's failure board, or null.
  static std::shared_ptr<Worker> start(int rank, int size,
                                       std::shared_ptr<const GroupTimeout> timeout,
                                       const Logger& log,
                                       std::shared_ptr<FailureBoard> board = nullptr);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The group's name, for messages (torch sets it after creation).
  void set_group(const std::string& name);
  // Queues an operation. make() runs under the queue lock (whatever it
  // records, such as error-feedback keys, is in submission order) and
  // returns the task; the task must settle work. On the worker thread the
  // task runs now instead (see "Callbacks"). Throws, without calling make(),
  // when the worker is broken or stopped; `what` names the operation in
  // messages ("all_reduce (float32, 1000 elements)"). Returns the timeout
  // the operation got: `timeout` when given (the operation's own, see
  // group_timeout.h), else the group's at submission.
  std::chrono::milliseconds submit(const std::string& what,
                                   const c10::intrusive_ptr<CompcollWork>& work,
                                   const std::function<Task()>& make,
                                   std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // c10d's addEphemeralTimeout: `extra` is added to the timeout of every
  // operation submitted from now on, until the first of them settles.
  // Calls accumulate; each extension ends with its own first operation.
  void add_ephemeral_timeout(std::chrono::milliseconds extra);

  // Runs issue() now and returns true when the worker is idle with nothing
  // queued, or when called on the worker thread; returns false otherwise
  // (queue it). Throws when broken or stopped. issue() runs outside the
  // queue lock (a device lane's first NCCL operation blocks until every
  // rank arrives; the watchdog and other threads need the lock meanwhile),
  // and what is submitted meanwhile waits behind it, in order.
  bool run_now_if_idle(const std::string& what, const std::function<void()>& issue);

  // Runs fn on the worker after everything submitted before it (at once on
  // the worker thread) and waits for it, at most until its deadline;
  // rethrows what it threw. With wait_at_most shorter than that, the wait
  // goes on past wait_at_most only if keep_waiting() then says so (the
  // caller's fn has started, say). fn may still be queued or running after
  // a timeout, so it must own (or share) everything it touches.
  void run_and_wait(const std::string& what, std::function<void()> fn,
                    std::optional<std::chrono::milliseconds> wait_at_most = std::nullopt,
                    const std::function<bool()>& keep_waiting = nullptr);

  // On the worker thread: runs the queued tasks up to and including
  // work's, in order, on this thread (see "Callbacks"); nothing when work
  // is not queued (running, issued, settled) or elsewhere.
  void run_queued_through(const CompcollWork* work);

  // Runs fn under the queue lock (for state kept in submission order).
  template <typename F>
  auto locked(F&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    return fn();
  }

  bool on_worker_thread() const;
  // "" while usable, else the error that broke it.
  std::string broken() const;
  // What holds the queue now, in words ("all_reduce (float32, 1000
  // elements), operation #7, running on the worker for 2.5 s"): the
  // operation a caller is issuing, the worker's task or its future's
  // callbacks; "" when the worker is idle.
  std::string holding_the_queue() const;
  // Stops both threads (idempotent); queued tasks, if any, fail. Waits for
  // the worker thread at most wait_at_most (and never past the group's
  // timeout and a grace), then leaves it behind (see "Lifetime").
  void stop(std::chrono::milliseconds wait_at_most = std::chrono::milliseconds::max());

 private:
  struct Entry {
    std::string what;
    c10::intrusive_ptr<CompcollWork> work;
    // deadline - submitted = timeout: the operation's own (own_timeout) or
    // the group's when it was submitted, plus `extended` (ephemeral
    // extensions active then). Its task runs with it as the group's
    // timeout on the worker thread (GroupTimeout::OperationScope), so the
    // waits it makes there keep it.
    Clock::time_point submitted, deadline, started;
    std::chrono::milliseconds timeout{0}, extended{0};
    bool own_timeout = false;
    enum State { kQueued, kRunning, kIssued } state = kQueued;
  };

  Worker(int rank, int size, std::shared_ptr<const GroupTimeout> timeout, const Logger& log,
         std::shared_ptr<FailureBoard> board);
  void worker_loop();
  void watchdog_loop();
  // Under mu_: a new entry for work, due a timeout from now, which forgets
  // it when it settles.
  uint64_t track(const std::string& what, const c10::intrusive_ptr<CompcollWork>& work,
                 Entry::State state, std::chrono::milliseconds timeout, bool own_timeout,
                 std::chrono::milliseconds extended);
  // Runs task as entry id's: on this thread, the group's timeout is the one
  // the entry was given.
  void run_task(uint64_t id, const Task& task);
  // Under mu_: takes the queue's front task and marks its entry running.
  std::pair<uint64_t, Task> take_front();
  // Runs a task take_front() took (errors go through its work; an escaping
  // exception is logged) and marks its entry finished running.
  void run_taken(uint64_t id, Task task);
  void forget(uint64_t id);
  void finished_running(uint64_t id);
  void check_usable(const std::string& what) const;  // under mu_
  std::string where() const;                         // "rank 0/2, group '1'"
  std::string holding_the_queue_locked(Clock::time_point now) const;  // under mu_
  // Under mu_: the timeout error of entry id, and breaks the worker.
  // *brief: the same in a few words, for the other ranks (failure board).
  std::string expire(uint64_t id, const Entry& e, Clock::time_point now, std::string* brief);
  // Under mu_ (released and taken again): breaks the worker with `broken`
  // and fails every unsettled operation, `first` with first_msg and the
  // others as cancelled, each message followed by the failure board's
  // account (the board is told `board_says`; followed: this rank stopped
  // waiting because of another's failure).
  void fail_all(std::unique_lock<std::mutex>& lock, uint64_t first, const std::string& first_msg,
                const std::string& cause, const std::string& board_says, bool followed);
  // Under mu_: when the watchdog should next read the failure board
  // (time_point::max(): not while nothing has been waiting long).
  Clock::time_point next_board_check() const;
  // Fails works with their errors on a short-lived thread (no user code on
  // the caller's thread) and destroys the dropped tasks there.
  static void fail_detached(std::vector<std::pair<c10::intrusive_ptr<CompcollWork>, std::string>> f,
                            std::deque<std::pair<uint64_t, Task>> dropped);

  const int rank_;
  const int size_;
  const std::shared_ptr<const GroupTimeout> timeout_;
  const Logger log_;
  const std::shared_ptr<FailureBoard> board_;  // null: none

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_;
  std::condition_variable watchdog_cv_;
  std::condition_variable exit_cv_;
  std::deque<std::pair<uint64_t, Task>> queue_;
  // Unsettled operations; ids rise with submission (and with deadlines,
  // unless the timeout was shortened in between).
  std::map<uint64_t, Entry> pending_;
  // Active ephemeral extensions: {extra, the id of the first operation
  // submitted after it (0: none yet)}. Under mu_.
  std::vector<std::pair<std::chrono::milliseconds, uint64_t>> ephemeral_;
  uint64_t next_id_ = 1;
  bool busy_ = false;
  // A caller is issuing an operation itself (run_now_if_idle), outside the
  // lock: the worker takes nothing off the queue until it is done. What and
  // since when, for messages.
  bool issuing_ = false;
  std::string issuing_what_;
  Clock::time_point issuing_since_;
  // The task the worker thread is running (outermost), for messages.
  uint64_t current_id_ = 0;
  std::string current_what_;
  Clock::time_point current_since_;
  std::string group_;
  std::string broken_;
  bool stopping_ = false;
  bool worker_exited_ = false;
  bool watchdog_stop_ = false;
  Clock::time_point watchdog_wakes_ = Clock::time_point::max();  // its next wake-up
  Clock::time_point board_checked_{};  // the watchdog's last read of the board
  // This rank's own post was found on an earlier read: acted on from the
  // next one (see watchdog_loop).
  bool own_post_seen_ = false;
  std::thread::id worker_id_;
  std::thread worker_;
  std::thread watchdog_;
};

}  // namespace compcoll::torch_integration
