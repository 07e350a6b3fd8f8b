#include "integration/pytorch/csrc/failure_board.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <regex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "compcoll/error.h"
#include "integration/pytorch/csrc/lane.h"

namespace compcoll::torch_integration {
namespace {

const std::string kWho = "compcoll_board/who/";
const std::string kCount = "compcoll_board/count";
const std::string kPost = "compcoll_board/post/";

// What one rank may post: the first line or two of a failure are what says
// what went wrong; the rest (stacks) only lengthens every other rank's error.
constexpr size_t kPostChars = 1000;
// Different failures quoted in the sentence, and ranks named in each list.
constexpr size_t kQuoted = 3;
constexpr size_t kNamed = 8;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// torch's store errors carry a C++ stack after their first line.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// What a post says, quoted in another rank's error: its first line, without
// the poster's "rank r/P: " (the quote names it), the source locations Gloo
// puts in front of its messages or the advice it puts after them.
std::string brief(const std::string& post) {
  std::string s = first_line(post);
  static const std::regex own_rank(R"(rank \d+/\d+(, group '[^']*')?: )");
  static const std::regex location(R"(\[[^\] ]*\.(cc|cpp|h):\d+\] )");
  s = std::regex_replace(s, own_rank, "");
  s = std::regex_replace(s, location, "");
  const size_t advice = s.find(". This is typically caused");
  if (advice != std::string::npos) s.resize(advice);
  constexpr size_t kBrief = 300;
  if (s.size() > kBrief) s = s.substr(0, kBrief) + "...";
  return s;
}

std::string identity() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "?");
  return detail::concat("pid ", getpid(), " on host ", host);
}

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", d.count() / 1000.0);
  return buf;
}

// "rank 3", "ranks 1, 3 and 5", "ranks 1, 2, ... and 12 more".
std::string ranks_phrase(const std::vector<std::string>& named) {
  std::string out = named.size() == 1 ? "rank " : "ranks ";
  const size_t shown = std::min(named.size(), kNamed);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += (i + 1 == named.size()) ? " and " : ", ";
    out += named[i];
  }
  if (shown < named.size()) out += detail::concat(" and ", named.size() - shown, " more");
  return out;
}

}  // namespace

FailureBoard::FailureBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                           std::shared_ptr<const GroupTimeout> timeout)
    : store_(std::move(store)), rank_(rank), size_(size), timeout_(std::move(timeout)) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!store_) {
    store_error_ = "the group has no store";
    return;
  }
  if (size_ <= 1) return;
  const std::string who_key = kWho + std::to_string(rank_);
  const std::string me = identity();
  auto baseline = call_store<int64_t>("posting this rank's identity", [who_key, me](c10d::Store& s) {
    s.set(who_key, bytes(me));
    return s.add(kCount, 0);
  });
  if (baseline) read_up_to_ = *baseline;
}

template <typename R>
std::optional<R> FailureBoard::call_store(const char* what, std::function<R(c10d::Store&)> fn) {
  if (!store_ || !store_error_.empty() || closed_.load()) return std::nullopt;
  // One call at a time: a call that did not answer in time may still be
  // blocked in the store (a stopped host); another would queue behind it
  // (the store's client serialises its calls) and leave one more thread.
  if (outstanding_ && !outstanding_()) return std::nullopt;
  outstanding_ = nullptr;
  struct Call {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<R> value;
    std::string error;
  };
  auto call = std::make_shared<Call>();
  auto body = [call, store = store_, fn = std::move(fn)] {
    std::optional<R> value;
    std::string error;
    try {
      value = fn(*store);
    } catch (const std::exception& e) {
      error = first_line(e.what());
    } catch (...) {
      error = "an unknown error";
    }
    std::lock_guard<std::mutex> lock(call->mu);
    call->value = std::move(value);
    call->error = std::move(error);
    call->done = true;
    call->cv.notify_all();
  };
  try {
    std::thread(body).detach();  // owns what it touches: it may outlive this call
  } catch (const std::system_error&) {
    body();  // no thread to be had: here, unbounded, as a plain store call is
  }
  bool done = false;
  without_gil([&] {
    std::unique_lock<std::mutex> lock(call->mu);
    done = call->cv.wait_for(lock, kStoreWait, [&] { return call->done; });
  });
  std::lock_guard<std::mutex> lock(call->mu);
  if (!done) {
    // Slow is not gone: the host (rank 0's process, unless a launcher hosts
    // the store) may be busy. Asked again once this call has returned.
    store_slow_ = detail::concat(what, ": no answer within ", seconds(kStoreWait), " s");
    outstanding_ = [call] {
      std::lock_guard<std::mutex> l(call->mu);
      return call->done;
    };
    return std::nullopt;
  }
  if (!call->error.empty()) {
    store_error_ = detail::concat(what, ": ", call->error);
    return std::nullopt;
  }
  store_slow_.clear();
  return std::move(call->value);
}

void FailureBoard::read_posts() {
  // Posts from the first one not read yet, those read out of order aside, a
  // bounded number per read (the first read after many ranks failed).
  constexpr int64_t kPerRead = 64;
  const int64_t from = read_up_to_;
  const std::set<int64_t> got = read_ahead_;
  using Read = std::pair<int64_t, std::vector<std::pair<int64_t, std::optional<std::string>>>>;
  auto read = call_store<Read>("reading the failures posted", [from, got](c10d::Store& s) {
    Read out;
    out.first = s.add(kCount, 0);
    for (int64_t n = from + 1; n <= out.first && n <= from + kPerRead; ++n) {
      if (got.count(n) != 0) continue;
      const std::string key = kPost + std::to_string(n);
      // Counted, not set (yet, or ever: its poster died in between).
      if (!s.check({key})) {
        out.second.emplace_back(n, std::nullopt);
        continue;
      }
      out.second.emplace_back(n, text(s.get(key)));
    }
    return out;
  });
  if (!read) return;
  posts_read_ = true;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [n, value] : read->second) {
    if (!value) {
      holes_.emplace(n, now);  // first seen now, unless seen before
      continue;
    }
    holes_.erase(n);
    read_ahead_.insert(n);
    // "<rank>\t<failed|followed>\t<text>"; anything else is not a post of ours.
    const size_t a = value->find('\t');
    const size_t b = a == std::string::npos ? a : value->find('\t', a + 1);
    if (b == std::string::npos) continue;
    Post p;
    try {
      p.rank = std::stoi(value->substr(0, a));
    } catch (const std::exception&) {
      continue;
    }
    if (p.rank < 0 || p.rank >= size_) continue;
    p.followed = value->compare(a + 1, b - a - 1, "followed") == 0;
    p.text = value->substr(b + 1);
    posts_.emplace(p.rank, std::move(p));  // a rank's first post stands
  }
  // The read prefix moves past posts read and past holes older than a
  // second: a post counted and never set must not hide the ones after it.
  for (;;) {
    const int64_t next = read_up_to_ + 1;
    if (read_ahead_.erase(next) != 0) {
      read_up_to_ = next;
      continue;
    }
    const auto hole = holes_.find(next);
    if (next <= read->first && hole != holes_.end() &&
        now - hole->second >= std::chrono::seconds(1)) {
      holes_.erase(hole);
      read_up_to_ = next;
      continue;
    }
    break;
  }
}

std::string with_account(std::string error, const std::string& account) {
  if (account.empty()) return error;
  // "Operation timed out!" and sentences of our own end the error already.
  while (!error.empty() && (error.back() == '.' || error.back() == '!' || error.back() == ' ')) {
    error.pop_back();
  }
  return error + ". " + account;
}

std::chrono::milliseconds FailureBoard::check_every() const {
  const int64_t ms = 500LL * std::max(1, size_) / 32;
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 500, 5000));
}

std::chrono::milliseconds FailureBoard::listen_for(std::chrono::milliseconds timeout) const {
  // At least one read of a waiting rank and half a second more: a rank that
  // only waits is heard from, not named as gone.
  const std::chrono::milliseconds least = check_every() + std::chrono::milliseconds(500);
  const std::chrono::milliseconds most = check_every() + std::chrono::milliseconds(2500);
  return std::clamp(timeout / 10, least, most);
}

std::string FailureBoard::report(const std::string& failure, bool followed,
                                 std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = timeout_ ? timeout_->get() : std::chrono::minutes(30);
  if (closed_.load()) return std::string();
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_) return *answer_;
  if (size_ <= 1 || closed_.load()) return std::string();
  posts_[rank_] = Post{rank_, followed, failure};
  const std::string value = detail::concat(rank_, "\t", followed ? "followed" : "failed", "\t",
                                           failure.substr(0, kPostChars));
  const auto post = [&] {
    return call_store<bool>("posting this rank's failure", [value](c10d::Store& s) {
             const int64_t n = s.add(kCount, 1);
             s.set(kPost + std::to_string(n), bytes(value));
             return true;
           }).has_value();
  };
  bool posted = post();
  // Who the ranks not heard from yet are, now: the store's host may be a
  // rank that fails too, and its process may end before this one has
  // listened (the silent ones among them are named with pid and host).
  if (posted) {
    read_posts();
    read_who();
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + listen_for(timeout);
  while (store_error_.empty() && (!posted || posts_.size() < static_cast<size_t>(size_))) {
    if (!posted) {
      posted = post();  // a slow store, asked again once its last call returned
    } else {
      read_posts();
    }
    if (std::chrono::steady_clock::now() >= deadline || closed_.load()) break;
    without_gil([] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
  }
  const auto listened = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  read_who();  // those still silent whose identity the first read missed
  answer_ = summary(listened);
  return *answer_;
}

void FailureBoard::read_who() {
  // A few: they are named, the rest counted.
  std::vector<int> silent;
  for (int r = 0; r < size_ && silent.size() < kNamed; ++r) {
    if (r != rank_ && posts_.count(r) == 0 && who_.count(r) == 0) silent.push_back(r);
  }
  if (silent.empty()) return;
  using Who = std::vector<std::pair<int, std::string>>;
  auto who = call_store<Who>("reading who the silent ranks are", [silent](c10d::Store& s) {
    Who out;
    for (int r : silent) {
      const std::string key = kWho + std::to_string(r);
      if (s.check({key})) out.emplace_back(r, text(s.get(key)));
    }
    return out;
  });
  if (who) {
    for (auto& [r, w] : *who) who_[r] = std::move(w);
  }
}

std::optional<FailureBoard::Post> FailureBoard::check_peers() {
  std::lock_guard<std::mutex> lock(mu_);
  auto first_other = [&]() -> std::optional<Post> {
    const Post* best = nullptr;
    for (const auto& [r, p] : posts_) {
      if (r == rank_) continue;
      if (best == nullptr || (best->followed && !p.followed)) best = &p;
    }
    return best != nullptr ? std::optional<Post>(*best) : std::nullopt;
  };
  if (auto known = first_other()) return known;
  if (size_ <= 1 || !store_error_.empty() || closed_.load()) return std::nullopt;
  read_posts();  // nothing when a slow call is still outstanding
  return first_other();
}

std::optional<FailureBoard::Post> FailureBoard::own_post() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = posts_.find(rank_);
  return it == posts_.end() ? std::nullopt : std::optional<Post>(it->second);
}

std::string FailureBoard::summary(std::chrono::milliseconds listened) const {
  // Ranks that failed are grouped by what they said (numbers aside: ports,
  // seconds, operation numbers), so that a timeout every survivor shares is
  // quoted once, not once per rank.
  auto shape = [](const std::string& s) {
    static const std::regex digits("[0-9]+");
    return std::regex_replace(s, digits, "#");
  };
  auto own = posts_.find(rank_);
  const std::string own_shape = own == posts_.end() ? "" : shape(brief(own->second.text));
  std::vector<std::string> followed, silent, same_as_own;
  std::vector<std::pair<std::string, std::vector<std::string>>> said;  // {brief, ranks}, in order
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto p = posts_.find(r);
    if (p == posts_.end()) {
      auto w = who_.find(r);
      silent.push_back(w == who_.end() ? std::to_string(r)
                                       : detail::concat(r, " (", w->second, ")"));
      continue;
    }
    if (p->second.followed) {
      followed.push_back(std::to_string(r));
      continue;
    }
    const std::string b = brief(p->second.text);
    const std::string sh = shape(b);
    if (sh == own_shape) {
      same_as_own.push_back(std::to_string(r));
      continue;
    }
    auto g = std::find_if(said.begin(), said.end(),
                          [&](const auto& x) { return shape(x.first) == sh; });
    if (g == said.end()) {
      said.emplace_back(b, std::vector<std::string>{std::to_string(r)});
    } else {
      g->second.push_back(std::to_string(r));
    }
  }
  std::vector<std::string> parts;
  // Silent ranks are known once the board was read: the store may go away
  // later (its host's process ended with its own failure).
  if (!silent.empty() && posts_read_) {
    // (A slow store leaves the word to the posts read before it.)
    parts.push_back(detail::concat(
        ranks_phrase(silent), " posted no failure ",
        store_error_.empty() ? "within " : "in the ", seconds(listened),
        store_error_.empty() ? " s" : " s before the store stopped answering",
        ": gone (killed, crashed, its host down) or stuck (stopped, or busy outside this "
        "group's collectives)"));
  }
  if (!same_as_own.empty()) {
    parts.push_back(ranks_phrase(same_as_own) + " failed the same way");
  }
  for (size_t i = 0; i < said.size(); ++i) {
    if (i == kQuoted) {
      size_t more = 0;
      for (size_t j = i; j < said.size(); ++j) more += said[j].second.size();
      parts.push_back(detail::concat(more, more == 1 ? " more rank" : " more ranks",
                                     " failed in other ways"));
      break;
    }
    // "too" beside this rank's own failure; a rank that only stopped waiting
    // did not fail by itself.
    const bool too = own != posts_.end() && !own->second.followed;
    parts.push_back(detail::concat(ranks_phrase(said[i].second), too ? " failed too: " : " failed: ",
                                   said[i].first));
  }
  if (!followed.empty()) {
    parts.push_back(ranks_phrase(followed) + " stopped waiting when a failure was posted");
  }
  if (!store_error_.empty()) {
    parts.push_back(detail::concat(
        posts_read_ ? "the store then stopped answering (" : "the store could not be asked (",
        store_error_, ")",
        posts_read_ ? ""
                    : ", so the other ranks are not known: the process hosting it (rank 0's, "
                      "unless a launcher such as torchrun hosts it) may be gone too"));
  } else if (!store_slow_.empty()) {
    parts.push_back(detail::concat(
        "the store was slow to answer (", store_slow_,
        posts_read_ ? ")" : "), so the other ranks are not known",
        ": the process hosting it (rank 0's, unless a launcher such as torchrun hosts it) is "
        "busy or stopped"));
  }
  std::string out = "The group's failure board (compcoll's, on the group's store) says: ";
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : "; ") + parts[i];
  return out;
}

}  // namespace compcoll::torch_integration
