#include "integration/pytorch/csrc/worker.h"

#include <cstdio>
#include <iterator>
#include <tuple>
#include <utility>
#include <exception>

#include "compcoll/error.h"
#include "integration/pytorch/csrc/deferred_release.h"
#include "integration/pytorch/csrc/lane.h"

namespace compcoll::torch_integration {
namespace {

std::string seconds(Worker::Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f",
                std::chrono::duration_cast<std::chrono::duration<double>>(d).count());
  return buf;
}

std::exception_ptr error(const std::string& msg) {
  return std::make_exception_ptr(Error(ErrorKind::kTransport, "compcoll: " + msg));
}

// How long stop() waits for a worker thread that is still running a task
// beyond the timeout (its own deadline has passed by then).
constexpr std::chrono::seconds kStopGrace{2};

}  // namespace

Worker::Worker(int rank, int size, std::shared_ptr<const GroupTimeout> timeout,
               const Logger& log, std::shared_ptr<FailureBoard> board)
    : rank_(rank), size_(size), timeout_(std::move(timeout)), log_(log), board_(std::move(board)) {}

std::shared_ptr<Worker> Worker::start(int rank, int size,
                                      std::shared_ptr<const GroupTimeout> timeout,
                                      const Logger& log, std::shared_ptr<FailureBoard> board) {
  CC_CHECK(timeout, kInvalidArgument, "the torch backend's worker needs the group's timeout");
  std::shared_ptr<Worker> w(new Worker(rank, size, std::move(timeout), log, std::move(board)));
  std::lock_guard<std::mutex> lock(w->mu_);  // no task before worker_id_ is known
  w->worker_ = std::thread([w] { w->worker_loop(); });
  w->worker_id_ = w->worker_.get_id();
  w->watchdog_ = std::thread([w] { w->watchdog_loop(); });
  return w;
}

Worker::~Worker() {
  // stop() joined or detached both threads; a thread that still runs holds
  // a reference, so this only runs once neither does.
  if (worker_.joinable()) worker_.detach();
  if (watchdog_.joinable()) watchdog_.detach();
}

void Worker::set_group(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  group_ = name;
}

bool Worker::on_worker_thread() const { return std::this_thread::get_id() == worker_id_; }

std::string Worker::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::string Worker::holding_the_queue() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holding_the_queue_locked(Clock::now());
}

std::string Worker::holding_the_queue_locked(Clock::time_point now) const {
  if (issuing_ && !busy_) {
    return detail::concat(issuing_what_, ", which its caller has been issuing for ",
                          seconds(now - issuing_since_),
                          " s (an inner backend's first operation waits for every rank)");
  }
  if (!busy_) return "";
  if (current_id_ != 0 && pending_.count(current_id_) == 0) {
    return detail::concat("the future callbacks of ", current_what_, " (operation #", current_id_,
                          "), which have held the worker for ", seconds(now - current_since_),
                          " s (a callback that blocks holds the worker)");
  }
  return detail::concat(current_what_, " (operation #", current_id_, "), running on the worker for ",
                        seconds(now - current_since_), " s");
}

std::string Worker::where() const {
  return detail::concat("rank ", rank_, "/", size_, ", group '",
                        group_.empty() ? "(unnamed)" : group_, "'");
}

void Worker::check_usable(const std::string& what) const {
  CC_CHECK(broken_.empty(), kTransport, where(), ": ", what,
           " refused: the group is unusable on this rank since an earlier operation failed (",
           broken_, ")");
  CC_CHECK(!stopping_, kInvalidArgument, where(), ": ", what,
           " on a torch backend that has shut down");
}

uint64_t Worker::track(const std::string& what, const c10::intrusive_ptr<CompcollWork>& work,
                       Entry::State state, std::chrono::milliseconds timeout,
                       bool own_timeout, std::chrono::milliseconds extended) {
  const uint64_t id = next_id_++;
  const Clock::time_point now = Clock::now();
  Entry& e = pending_[id];
  e.what = what;
  e.work = work;
  e.submitted = now;
  e.deadline = now + timeout;
  e.timeout = timeout;
  e.extended = extended;
  e.own_timeout = own_timeout;
  for (auto& [extra, first] : ephemeral_) {
    if (first == 0) first = id;  // the extension ends when this one settles
  }
  // Only after a shortened timeout can a new entry fall due before the
  // watchdog wakes; then it must wake now and take this deadline. With a
  // failure board, a watchdog asleep for longer than kCheckAfter (idle
  // until now) must wake to read the board while this entry waits.
  if (e.deadline < watchdog_wakes_ ||
      (board_ && now + FailureBoard::kCheckAfter < watchdog_wakes_)) {
    watchdog_cv_.notify_all();
  }
  e.started = now;
  e.state = state;
  std::weak_ptr<Worker> self = weak_from_this();
  work->on_settle([self, id] {
    if (auto w = self.lock()) w->forget(id);
  });
  return id;
}

void Worker::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
  std::erase_if(ephemeral_, [id](const auto& x) { return x.second == id; });
}

void Worker::add_ephemeral_timeout(std::chrono::milliseconds extra) {
  CC_CHECK(extra.count() >= 0, kInvalidArgument,
           "an ephemeral timeout extension cannot be negative, got ", extra.count(), " ms");
  if (extra.count() == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ephemeral_.emplace_back(extra, 0);
}

void Worker::run_task(uint64_t id, const Task& task) {
  std::chrono::milliseconds timeout = timeout_->group();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) timeout = it->second.timeout;
  }
  const GroupTimeout::OperationScope scope(*timeout_, timeout);
  task();
}

void Worker::finished_running(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  if (it->second.work->handed_to_caller()) {
    // A send or receive its caller's wait completes, with the caller's
    // timeout from that wait, as Gloo's own: not the worker's to bound.
    pending_.erase(it);
    std::erase_if(ephemeral_, [id](const auto& x) { return x.second == id; });
    return;
  }
  it->second.state = Entry::kIssued;  // completes asynchronously
}

std::chrono::milliseconds Worker::submit(const std::string& what,
                                         const c10::intrusive_ptr<CompcollWork>& work,
                                         const std::function<Task()>& make,
                                         std::optional<std::chrono::milliseconds> given) {
  std::unique_lock<std::mutex> lock(mu_);
  check_usable(what);
  Task task = make();
  // Said as its own only where it differs from the group's.
  const bool own = given.has_value() && *given != timeout_->group();
  std::chrono::milliseconds extended{0};
  for (const auto& x : ephemeral_) extended += x.first;
  const std::chrono::milliseconds timeout = given.value_or(timeout_->group()) + extended;
  work->set_timeout(timeout);
  if (on_worker_thread()) {
    // Issued by a future callback the worker is running: now, here.
    const uint64_t id = track(what, work, Entry::kRunning, timeout, own, extended);
    lock.unlock();
    run_task(id, task);
    finished_running(id);
    return timeout;
  }
  const uint64_t id = track(what, work, Entry::kQueued, timeout, own, extended);
  std::weak_ptr<Worker> self = weak_from_this();
  work->set_run_ahead([self](const CompcollWork* w) {
    if (auto worker = self.lock()) worker->run_queued_through(w);
  });
  queue_.emplace_back(id, std::move(task));
  lock.unlock();
  work_cv_.notify_one();
  return timeout;
}

bool Worker::run_now_if_idle(const std::string& what, const std::function<void()>& issue) {
  std::unique_lock<std::mutex> lock(mu_);
  check_usable(what);
  if (on_worker_thread()) {
    lock.unlock();  // issued by a callback: its place in the order is here
    issue();
    return true;
  }
  if (busy_ || issuing_ || !queue_.empty()) return false;
  // Nothing is issued ahead of it: the worker takes no task and no other
  // caller issues while issuing_ is set (submissions meanwhile queue).
  issuing_ = true;
  issuing_what_ = what;
  issuing_since_ = Clock::now();
  lock.unlock();
  struct Issued {
    Worker* w;
    ~Issued() {
      {
        std::lock_guard<std::mutex> relock(w->mu_);
        w->issuing_ = false;
      }
      w->work_cv_.notify_one();
    }
  } issued{this};
  issue();
  return true;
}

void Worker::run_and_wait(const std::string& what, std::function<void()> fn,
                          std::optional<std::chrono::milliseconds> wait_at_most,
                          const std::function<bool()>& keep_waiting) {
  if (on_worker_thread()) {
    fn();
    return;
  }
  auto work = c10::make_intrusive<CompcollWork>(rank_, c10d::OpType::UNKNOWN, "compcoll:internal",
                                                std::vector<at::Tensor>{});
  const std::chrono::milliseconds timeout = submit(what, work, [&] {
    return [work, fn = std::move(fn)] {
      try {
        fn();
      } catch (...) {
        work->fail(std::current_exception());
        return;
      }
      work->complete();
    };
  });
  without_gil([&] {
    // The watchdog fails the work at its deadline; the margin only bounds
    // this wait should the watchdog itself be held up.
    const std::chrono::milliseconds bound = timeout + kStopGrace;
    const std::chrono::milliseconds first = std::min(bound, wait_at_most.value_or(bound));
    // true: settled (what it threw is rethrown); false: still unsettled.
    const auto settled_within = [&](std::chrono::milliseconds limit) {
      try {
        work->wait(limit);
        return true;
      } catch (const c10::Error&) {
        if (work->settled()) throw;
        return false;
      }
    };
    if (settled_within(first)) return;
    std::chrono::milliseconds waited = first;
    if (first < bound && keep_waiting && keep_waiting()) {
      if (settled_within(bound - first)) return;
      waited = bound;
    }
    CC_THROW(kTransport, where(), ": ", what, " did not finish within ", waited.count(), " ms");
  });
}

void Worker::run_queued_through(const CompcollWork* work) {
  if (!on_worker_thread()) return;
  std::unique_lock<std::mutex> lock(mu_);
  // work's place in the queue. Only this thread takes tasks off it (the
  // worker loop is this thread, busy in the callback), and submissions go
  // behind: the tasks ahead of work are these, whatever is submitted
  // meanwhile.
  size_t ahead = queue_.size();
  for (size_t i = 0; i < queue_.size(); ++i) {
    auto it = pending_.find(queue_[i].first);
    if (it != pending_.end() && it->second.work.get() == work) {
      ahead = i;
      break;
    }
  }
  if (ahead == queue_.size()) return;  // not queued: running, issued or settled
  for (size_t run = 0; run <= ahead && !stopping_ && broken_.empty() && !queue_.empty(); ++run) {
    auto it = pending_.find(queue_.front().first);
    const bool target = it != pending_.end() && it->second.work.get() == work;
    auto [id, task] = take_front();
    lock.unlock();
    run_taken(id, std::move(task));
    lock.lock();
    if (target) break;
  }
}

std::pair<uint64_t, Worker::Task> Worker::take_front() {
  std::pair<uint64_t, Task> front = std::move(queue_.front());
  queue_.pop_front();
  auto it = pending_.find(front.first);
  if (it != pending_.end()) {
    it->second.state = Entry::kRunning;
    it->second.started = Clock::now();
  }
  return front;
}

void Worker::run_taken(uint64_t id, Task task) {
  try {
    run_task(id, task);  // tasks report their own errors through their work
  } catch (const std::exception& e) {
    log_.warn("a task of the torch backend's worker failed: ", e.what());
  }
  task = nullptr;  // what it captured goes now, not when the next one comes
  finished_running(id);
}

void Worker::worker_loop() {
  for (;;) {
    uint64_t id = 0;
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle until there is work or the backend stops (stop() wakes it).
      // Nor while a caller issues an operation itself (run_now_if_idle): a
      // task taken now would be issued ahead of it on some ranks.
      work_cv_.wait(lock, [&] { return !issuing_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) {
        worker_exited_ = true;
        exit_cv_.notify_all();
        return;
      }
      std::tie(id, task) = take_front();
      busy_ = true;
      current_id_ = id;
      current_since_ = Clock::now();
      auto it = pending_.find(id);
      current_what_ = it != pending_.end() ? it->second.what : std::string("an operation");
    }
    run_taken(id, std::move(task));
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

std::string Worker::expire(uint64_t id, const Entry& e, Clock::time_point now,
                           std::string* brief) {
  std::string reason;
  const char* where_it_was = "";
  switch (e.state) {
    case Entry::kQueued:
      where_it_was = "queued behind another operation";
      reason = detail::concat("it was waiting for the worker thread, behind ",
                              holding_the_queue_locked(now));
      break;
    case Entry::kRunning:
      // Running means waiting for peers: say which peers can hold it, since
      // ranks that called different collectives or sizes look the same here.
      where_it_was = "waiting for its peers";
      reason = detail::concat("it had been running on the worker thread for ",
                              seconds(now - e.started),
                              " s, waiting for its peers (one that is gone or stuck, or one that "
                              "called another operation or an allreduce of another size, holds "
                              "it)");
      break;
    case Entry::kIssued:
      where_it_was = "issued to the inner backend";
      reason = detail::concat("it was issued to the inner backend ", seconds(now - e.started),
                              " s ago and has not completed");
      break;
  }
  const std::string msg = detail::concat(
      where(), ": ", e.what, " (operation #", id, ") did not finish within ",
      e.own_timeout ? "its own timeout (from its options) of " : "the group's timeout of ",
      e.timeout.count(), " ms",
      e.extended.count() > 0
          ? detail::concat(" (", e.extended.count(), " ms of it an ephemeral extension)")
          : std::string(),
      ": ", reason,
      ". The group cannot be used on this rank any more: destroy it and create a new one");
  *brief = detail::concat(e.what, " (operation #", id, ") timed out after ", e.timeout.count(),
                          " ms, ", where_it_was);
  broken_ = msg;
  return msg;
}

Worker::Clock::time_point Worker::next_board_check() const {
  if (!board_ || pending_.empty()) return Clock::time_point::max();
  // pending_ is ordered by id, so by submission: the first waited longest.
  return std::max(pending_.begin()->second.submitted + FailureBoard::kCheckAfter,
                  board_checked_ + board_->check_every());
}

void Worker::fail_all(std::unique_lock<std::mutex>& lock, uint64_t first,
                      const std::string& first_msg, const std::string& cause,
                      const std::string& board_says, bool followed) {
  broken_ = first_msg;
  auto it = pending_.find(first);
  const std::chrono::milliseconds timeout =
      it != pending_.end() ? it->second.timeout : timeout_->group();
  std::vector<std::pair<c10::intrusive_ptr<CompcollWork>, std::string>> fail;
  for (auto& [id, e] : pending_) {
    fail.emplace_back(e.work, id == first
                                  ? first_msg
                                  : detail::concat(where(), ": ", e.what, " (operation #", id,
                                                   ") cancelled: ", cause, " (", first_msg, ")"));
  }
  pending_.clear();
  std::deque<std::pair<uint64_t, Task>> dropped = std::move(queue_);
  queue_.clear();
  lock.unlock();
  // The worker is broken: nothing new is submitted while the board listens.
  if (board_) {
    const std::string said = board_->report(board_says, followed, timeout);
    for (auto& f : fail) f.second = with_account(std::move(f.second), said);
  }
  fail_detached(std::move(fail), std::move(dropped));
  lock.lock();
}

void Worker::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!watchdog_stop_) {
    if (pending_.empty() || !broken_.empty()) {
      // Nothing can fall due before a new entry's deadline, a timeout away
      // (track() wakes this wait when the timeout has shrunk since).
      watchdog_wakes_ = Clock::now() + timeout_->group();
      watchdog_cv_.wait_until(lock, watchdog_wakes_);
      continue;
    }
    // The earliest deadline (the oldest entry's, unless the timeout was
    // shortened since it was submitted); the oldest of those on a tie.
    auto first = pending_.begin();
    for (auto it = std::next(first); it != pending_.end(); ++it) {
      if (it->second.deadline < first->second.deadline) first = it;
    }
    const Clock::time_point now = Clock::now();
    if (now < first->second.deadline) {
      // Copies: wait_until reads its argument again after waking, and the
      // entry may have settled (been erased) while the lock was released.
      const Clock::time_point due = first->second.deadline;
      const Clock::time_point check = next_board_check();
      if (check <= now) {
        board_checked_ = now;
        lock.unlock();
        // This rank's own failure first (a compressed allreduce that failed
        // here leaves the worker usable): the operations after it wait for
        // nothing either, and no other rank is to blame.
        const std::optional<FailureBoard::Post> own = board_->own_post();
        const std::optional<FailureBoard::Post> post = own ? own : board_->check_peers();
        lock.lock();
        // The operation that posted this rank's failure fails with its own
        // error (the cause, then the board's account) right after its
        // report() returns, and may still be pending here: found the first
        // time, the post is acted on at the next read, a read period later,
        // so that operation's cause is not replaced by "failed earlier".
        const bool own_new = own && !own_post_seen_;
        own_post_seen_ = own_post_seen_ || own.has_value();
        if (post && !own_new && !pending_.empty() && broken_.empty() && !watchdog_stop_) {
          // The oldest unsettled operation is the one this rank waits in.
          const auto& [id, e] = *pending_.begin();
          const std::string who =
              own ? std::string("this rank failed earlier in the group (its earlier error says "
                                "why)")
                  : detail::concat("rank ", post->rank,
                                   post->followed ? " stopped waiting on the group" : " failed",
                                   " (it posted so on the group's failure board), and the group "
                                   "is unusable there");
          const std::string msg = detail::concat(
              where(), ": ", e.what, " (operation #", id, ") stopped waiting after ",
              seconds(now - e.submitted), " s: ", who,
              ". The group cannot be used on this rank any more: destroy it and create a new "
              "one");
          fail_all(lock, id, msg,
                   own ? std::string("this rank failed earlier")
                       : detail::concat("rank ", post->rank, " failed"),
                   detail::concat("stopped waiting in ", e.what, " (operation #", id,
                                  ") when rank ", post->rank, "'s failure was posted"),
                   /*followed=*/true);
        }
        continue;
      }
      watchdog_wakes_ = std::min(due, check);
      const Clock::time_point wake = watchdog_wakes_;
      watchdog_cv_.wait_until(lock, wake);
      continue;
    }
    const uint64_t id = first->first;
    std::string brief;
    const std::string msg = expire(id, first->second, now, &brief);
    fail_all(lock, id, msg, "an earlier operation timed out", brief, /*followed=*/false);
  }
}

void Worker::fail_detached(
    std::vector<std::pair<c10::intrusive_ptr<CompcollWork>, std::string>> f,
    std::deque<std::pair<uint64_t, Task>> dropped) {
  if (f.empty() && dropped.empty()) return;
  std::thread([f = std::move(f), dropped = std::move(dropped)]() mutable {
    for (auto& [work, msg] : f) {
      work->fail(error(msg));
      DeferredRelease::keep(std::move(work));  // not dropped on this thread
    }
    dropped.clear();
  }).detach();
}

void Worker::stop(std::chrono::milliseconds wait_at_most) {
  std::vector<std::pair<c10::intrusive_ptr<CompcollWork>, std::string>> fail;
  std::deque<std::pair<uint64_t, Task>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [id, task] : queue_) {
      auto it = pending_.find(id);
      if (it == pending_.end()) continue;
      fail.emplace_back(it->second.work,
                        detail::concat(where(), ": ", it->second.what, " (operation #", id,
                                       ") cancelled: the backend shut down before it ran"));
      pending_.erase(it);
    }
    dropped = std::move(queue_);
    queue_.clear();
  }
  work_cv_.notify_all();
  fail_detached(std::move(fail), std::move(dropped));
  if (worker_.joinable()) {
    if (on_worker_thread()) {
      worker_.detach();  // the last reference died in a callback on the worker
    } else {
      bool exited = false;
      without_gil([&] {
        std::unique_lock<std::mutex> lock(mu_);
        exited = exit_cv_.wait_for(lock, std::min(timeout_->group() + kStopGrace, wait_at_most),
                                   [&] { return worker_exited_; });
      });
      if (exited) {
        worker_.join();
      } else {
        // Wedged (a callback that never returns): it keeps this object
        // alive, and its task what it captured, until it ends.
        std::string what;
        {
          std::lock_guard<std::mutex> lock(mu_);
          what = detail::concat(where(), ": the worker thread has been busy for ",
                                seconds(Clock::now() - current_since_), " s with ", current_what_);
        }
        log_.warn(what, " (operation #", current_id_,
                  ") and is still busy at shutdown; leaving it behind");
        worker_.detach();
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchdog_stop_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) without_gil([&] { watchdog_.join(); });
}

}  // namespace compcoll::torch_integration
