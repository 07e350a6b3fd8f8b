// libFuzzer target: the configuration parser (plugin/config.h: load_config)
// fed arbitrary name/value pairs through a fake EnvLookup.
//
// Input: records of [selector][length][bytes...]. The selector picks a
// variable of the configuration table, torchrun's RANK / WORLD_SIZE, or (for
// the rest) an arbitrary name spelled by the record; the value is arbitrary
// bytes (NUL included). A later record for the same name wins.
//
// Invariants:
//   - load_config returns or throws compcoll::Error(kInvalidArgument);
//     nothing else, and no crash/UB (ASan, UBSan);
//   - an accepted configuration is one every consumer can use without
//     surprise: the algorithm is registered; building it (make_algorithm)
//     and describing it (agreement_description) return or throw
//     compcoll::Error; fractions are in (0, 1]; rank < world size;
//   - an accepted integer setting keeps the value it was given (no silent
//     narrowing of "4294967296" to 0);
//   - the timeout can be added to steady_clock::now() (what every deadline
//     in transport/ does) without overflowing.
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "collectives/registry.h"
#include "plugin/config.h"
#include "tests/fuzz/fuzz_common.h"

using namespace compcoll;
using namespace compcoll::fuzz;

namespace {

// Value of a decimal integer string as strtoll reads it (what the table's
// parser uses), or nullopt.
std::optional<long long> as_integer(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

template <typename F>
void only_compcoll_errors(const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw %s\n", what, e.what());
    fuzz_fail("something other than compcoll::Error was thrown");
  } catch (...) {
    fuzz_fail("a non-standard exception was thrown");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto table = config_table();
  std::map<std::string, std::string> env;
  size_t i = 0;
  while (i + 2 <= size) {
    const size_t sel = data[i] % (table.size() + 3);
    size_t len = data[i + 1];
    i += 2;
    std::string name;
    if (sel < table.size()) {
      name = table[sel].name;
    } else if (sel == table.size()) {
      name = "RANK";
    } else if (sel == table.size() + 1) {
      name = "WORLD_SIZE";
    } else {
      const size_t nlen = std::min(len % 32, size - i);
      name.assign(reinterpret_cast<const char*>(data + i), nlen);
      i += nlen;
      len = i < size ? data[i++] : 0;
    }
    len = std::min(len, size - i);
    env[name] = std::string(reinterpret_cast<const char*>(data + i), len);
    i += len;
  }
  EnvLookup lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };

  Config cfg;
  bool ok = false;
  try {
    cfg = load_config(lookup);
    ok = true;
  } catch (const Error& e) {
    FUZZ_CHECK(e.kind() == ErrorKind::kInvalidArgument, "load_config threw an Error that is not kInvalidArgument");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "load_config threw %s\n", e.what());
    fuzz_fail("load_config threw something other than compcoll::Error");
  } catch (...) {
    fuzz_fail("load_config threw a non-standard exception");
  }
  if (!ok) return 0;

  bool registered = false;
  for (const auto& a : algorithm_table()) registered = registered || cfg.algo == a.name;
  FUZZ_CHECK(registered, "an unregistered algorithm was accepted");
  const AlgoParams& p = cfg.params;
  // auto (kAutoDensity) resolves per algorithm; what each runs at must be valid.
  FUZZ_CHECK(p.density == kAutoDensity || (p.density > 0.0 && p.density <= 1.0),
             "density outside (0, 1] accepted");
  for (const char* algo : {"dgc", "sdagc", "sbc", "auto"}) {
    const double d = density_for(algo, p);
    FUZZ_CHECK(d > 0.0 && d <= 1.0, "a resolved density outside (0, 1]");
  }
  FUZZ_CHECK(p.csc_fraction > 0.0 && p.csc_fraction <= 1.0, "csc fraction outside (0, 1] accepted");
  FUZZ_CHECK(p.sample_fraction > 0.0 && p.sample_fraction <= 1.0, "sample fraction outside (0, 1] accepted");
  FUZZ_CHECK(p.csc_chunk >= 1, "csc chunk 0 accepted");
  FUZZ_CHECK(p.momentum >= 0.0f && p.clip >= 0.0f, "negative momentum or clip accepted");
  FUZZ_CHECK(cfg.rank < 0 || cfg.world_size < 0 || cfg.rank < cfg.world_size, "rank >= world size accepted");
  FUZZ_CHECK(cfg.timeout.count() >= 1, "non-positive timeout accepted");

  // A variable reported as changing nothing is one that is set and that a
  // compressed algorithm reads (never a communicator setting).
  for (const std::string& m : inert_settings(cfg, lookup)) {
    const std::string name = m.substr(0, m.find('='));
    const auto v = lookup(name.c_str());
    FUZZ_CHECK(v && !v->empty(), "an unset variable was reported as changing nothing");
    bool algorithm_variable = false;
    for (const ConfigVar& var : config_table()) {
      // Or one this front end ignores (ConfigVar::ignored_by: the
      // interposer's library paths under the C API).
      algorithm_variable = algorithm_variable ||
                           (name == var.name && (*var.tunes || (var.ignored_by & bit(cfg.front_end))));
    }
    FUZZ_CHECK(algorithm_variable, "a communicator setting was reported as changing nothing");
  }

  // Integers keep their value. The value that was in effect: COMPCOLL_X,
  // else the torchrun fallback for rank and world size.
  auto effective = [&](const char* name, const char* fallback) -> std::optional<std::string> {
    auto v = lookup(name);
    if ((!v || v->empty()) && fallback) v = lookup(fallback);
    if (!v || v->empty()) return std::nullopt;
    return v;
  };
  auto same_integer = [&](const char* name, const char* fallback, long long got) {
    const auto text = effective(name, fallback);
    if (!text) return;
    const auto v = as_integer(*text);
    if (v && *v != got) {
      std::fprintf(stderr, "%s=%s was accepted as %lld\n", name, text->c_str(), got);
      fuzz_fail("an accepted integer setting did not keep its value");
    }
  };
  same_integer("COMPCOLL_RANK", "RANK", cfg.rank);
  same_integer("COMPCOLL_WORLD_SIZE", "WORLD_SIZE", cfg.world_size);
  same_integer("COMPCOLL_WARMUP_STEPS", nullptr, p.warmup_steps);
  same_integer("COMPCOLL_TIMEOUT_MS", nullptr, cfg.timeout.count());

  // Every deadline in transport/ is steady_clock::now() + timeout, in the
  // clock's nanoseconds.
  using std::chrono::steady_clock;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             steady_clock::now().time_since_epoch()).count();
  int64_t timeout_ns = 0, deadline_ns = 0;
  if (__builtin_mul_overflow(int64_t{cfg.timeout.count()}, int64_t{1000000}, &timeout_ns) ||
      __builtin_add_overflow(now_ns, timeout_ns, &deadline_ns)) {
    std::fprintf(stderr, "COMPCOLL_TIMEOUT_MS=%lld\n", static_cast<long long>(cfg.timeout.count()));
    fuzz_fail("the accepted timeout overflows steady_clock::now() + timeout");
  }

  only_compcoll_errors("agreement_description", [&] { (void)cfg.agreement_description(); });
  only_compcoll_errors("make_algorithm", [&] { (void)make_algorithm(cfg.algo, cfg.params); });
  return 0;
}
