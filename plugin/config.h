// compcoll's configuration: one declarative table of COMPCOLL_* variables
// (name, type, default, allowed values, doc). It is parsed once, validated
// (a bad value is an error naming the variable, the value and what is
// allowed, raised before any traffic), and printed by compcoll-info. No other
// code reads the environment for settings.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/algorithm.h"
#include "compcoll/error.h"

namespace compcoll {

enum class LogLevel { kWarn = 0, kInfo = 1, kTrace = 2 };

// Who builds a communicator. The PyTorch backend and the NCCL interposer take
// some settings from the framework they sit in (the rank from the process
// group or the NCCL communicator, say), so a COMPCOLL_* variable for them
// changes nothing there (ConfigVar::ignored_by).
enum class FrontEnd : unsigned {
  kAny = 0,             // compcoll-info: a configuration, whoever will read it
  kStandalone = 1,      // the C API, the C++ Communicator
  kTorchBackend = 2,    // integration/pytorch
  kNcclInterposer = 4,  // plugin/nccl_interposer
  kBenchmark = 8,       // compcoll-bench: its ranks, rows and rendezvous come from its flags
};
const char* front_end_name(FrontEnd f);

struct Config {
  std::string algo = "dense";  // COMPCOLL_ALGO; unset or "dense" = off
  AlgoParams params;
  size_t min_elems = 16384;
  // COMPCOLL_TORCH_SCOPE=all: the PyTorch backend may compress allreduces
  // issued outside a backward pass too (default: only those inside one).
  bool torch_scope_all = false;
  std::string transport = "tcp";
  std::string iface;
  std::string hostname;
  std::string rendezvous;  // file://DIR or redis://HOST:PORT
  int rank = -1;           // -1: not given
  int world_size = -1;
  std::chrono::milliseconds timeout{30000};
  // COMPCOLL_HIERARCHY (off|host|shards|auto) and COMPCOLL_HOST_ID (this rank's host
  // id; "" = detected, see transport/shm_host.h): the two-level host hierarchy.
  std::string hierarchy = "auto";
  std::string host_id;
  LogLevel debug = LogLevel::kWarn;
  std::string stats_file;
  // Not a variable: the resolved COMPCOLL_STATS_FILE path that the
  // communicator's owner writes for the whole process (the PyTorch backend,
  // the NCCL interposer), which clear stats_file. The communicator checks at
  // creation, with the other ranks, that it can be written.
  std::string owner_stats_path;
  std::string state_dir;  // COMPCOLL_STATE_DIR: error-feedback checkpoints; "" = off
  // Not a variable: names this communicator's state file when one process
  // holds several (the PyTorch backend's lanes).
  std::string state_tag;
  // Not a variable: the group a communicator's log lines name beside its
  // rank (the PyTorch backend's subgroups); empty for the job's world.
  std::string log_group;
  // COMPCOLL_DEVICE_CODECS=on: the NCCL interposer runs the GPU codecs on
  // device memory where it can (not agreed on: the same bits either way).
  bool device_codecs = false;
  // COMPCOLL_NCCL_COMMS=multi-host: the NCCL interposer compresses only the
  // communicators whose ranks span several hosts (tensor-parallel groups
  // within a node stay exact).
  bool nccl_multi_host_only = false;
  std::string nccl_library = "libnccl.so.2";  // the NCCL interposer's real NCCL
  std::string cuda_library = "libcuda.so.1";  // and the CUDA driver it uses
  // Not a variable: whether a communicator made with this configuration
  // warns about COMPCOLL_* variables set in the environment that its
  // algorithm does not read (inert_settings). Off only where a tool runs
  // several algorithms from one environment (the benchmark's dense row).
  bool report_inert_settings = true;
  // Not a variable: who builds the communicator (set by the PyTorch backend
  // and the NCCL interposer), for the settings it does not read.
  FrontEnd front_end = FrontEnd::kStandalone;
  // Not a variable: the communicator compresses device tensors staged
  // through host memory (the NCCL interposer, the PyTorch backend's cuda
  // lane), whose host cores are otherwise idle: COMPCOLL_CODEC_THREADS=auto
  // gives dgc's encode several of them. Every rank of a communicator sets
  // it alike (its creation exchanges the machines' CPUs then).
  bool stages_device_tensors = false;

  bool compression_enabled() const { return algo != "dense"; }
  // "algo=...;" + params.canonical() + the other settings that change the
  // math (min_elems): what ranks must agree on. A setting that changes
  // nothing for this configuration (the table's `tunes` and
  // `idle_because`, as inert_settings says) enters at its default: a rank
  // that alone sets COMPCOLL_CSC_CHUNK under dgc is told it changes
  // nothing, and is not also refused as a mismatch.
  std::string agreement_description() const;
};

enum class VarType { kEnum, kDouble, kInt, kBool, kString };
const char* var_type_name(VarType t);

struct ConfigVar {
  const char* name;
  VarType type;
  const char* default_value;  // as text; "" = unset
  const char* allowed;        // human-readable: "dense|dgc|..." or "(0, 1]"
  const char* doc;
  // Parses value (never empty) into cfg; throws kInvalidArgument.
  void (*apply)(const ConfigVar& var, const std::string& value, Config& cfg);
  // The algorithms whose behaviour the variable changes: registered names,
  // comma-separated ("dgc,sdagc"), kTunesCompressed for every algorithm but
  // dense, or "" for a setting of the communicator itself (transport,
  // rendezvous, logging). A variable set for an algorithm it does not tune
  // changes nothing, and the communicator says so (inert_settings).
  const char* tunes = "";
  // For a variable that an algorithm of `tunes` reads only under some other
  // setting: why it changes nothing under cfg's ("with COMPCOLL_WARMUP_STEPS=0:
  // there is no warm-up to shape"), or nullptr while it is read. Asked only
  // when `tunes` covers cfg's algorithm; nullptr = read whenever it does.
  const char* (*idle_because)(const Config& cfg) = nullptr;
  // The front ends (FrontEnd bits) that never read the variable, taking the
  // setting from their framework; set there, it changes nothing and the
  // communicator says so (inert_settings). 0 = read by all.
  unsigned ignored_by = 0;
  // Why those front ends do not read it; nullptr: what each front end's
  // framework gives (the rank, the world size, the network).
  const char* ignored_because = nullptr;
};

constexpr unsigned bit(FrontEnd f) { return static_cast<unsigned>(f); }
inline constexpr unsigned kFrameworkGivesIt = bit(FrontEnd::kTorchBackend) | bit(FrontEnd::kNcclInterposer);
// The front ends on host buffers of their own: the C API and the benchmark.
inline constexpr unsigned kHostFrontEnds = bit(FrontEnd::kStandalone) | bit(FrontEnd::kBenchmark);

// The front ends of var.ignored_by, in words ("" when read by all).
std::string ignored_by_in_words(const ConfigVar& var);

inline constexpr const char* kTunesCompressed = "compressed";

std::span<const ConfigVar> config_table();

// Reads a variable; nullopt when unset. Defaults to the process environment.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup process_env();

// env without the variables that front end `fe` ignores (ConfigVar::
// ignored_by; RANK and WORLD_SIZE go with COMPCOLL_RANK and
// COMPCOLL_WORLD_SIZE): a front end that takes them from its framework
// neither reads nor refuses them (inert_settings, on the whole environment,
// says once that they change nothing).
EnvLookup env_read_by(FrontEnd fe, EnvLookup env = process_env());

// Parses every variable of the table. An empty value counts as unset.
// COMPCOLL_RANK / COMPCOLL_WORLD_SIZE fall back to torchrun's RANK /
// WORLD_SIZE.
Config load_config(const EnvLookup& env = process_env());

// e again, its message naming the setting behind the limit that expired
// (COMPCOLL_TIMEOUT_MS) when that limit is cfg.timeout and cfg's front end
// reads the variable, then `advice`: the transport knows its limit, not the
// variable that set it. A limit from elsewhere (a framework's own timeout,
// an operation's own) leaves the message as it is.
TimeoutError naming_timeout_setting(const TimeoutError& e, const Config& cfg,
                                    std::string_view advice);

// The algorithms whose variables cfg's communicator reads: none for dense,
// auto's own and its COMPCOLL_AUTO_ALGO's for auto.
std::vector<std::string_view> algorithms_in_use(const Config& cfg);

// What the environment holds that changes nothing (config_diagnostics.cc):

// The algorithm names var.tunes lists; none for kTunesCompressed and for a
// communicator setting.
std::vector<std::string_view> tuned_algorithms(const ConfigVar& var);

// Whether var changes anything for cfg's algorithm; COMPCOLL_ALGO=auto reads
// its own variables and those of COMPCOLL_AUTO_ALGO.
bool tunes(const ConfigVar& var, const Config& cfg);

// "dgc, sbc, sdagc", "every algorithm but dense", or "" (var.tunes in words).
std::string tunes_in_words(const ConfigVar& var);

// One message per variable that env sets (non-empty) and that cfg's
// algorithm does not read: "COMPCOLL_DENSITY=0.01 changes nothing for
// COMPCOLL_ALGO=onebit (it tunes dgc, sbc, sdagc)".
std::vector<std::string> inert_settings(const Config& cfg, const EnvLookup& env);

// inert_settings(cfg, process_env())'s messages that this process has not
// reported yet: every communicator calls it at creation, and a process that
// creates several (PyTorch's groups and lanes, NCCL communicators) says each
// once.
std::vector<std::string> inert_setting_warnings_once(const Config& cfg);

// inert_settings for a run of several algorithms from one environment (the
// benchmark's rows, cfg.front_end's): a variable is said to change nothing
// when no algorithm of `algos` reads it, or when its front end does not.
std::vector<std::string> inert_settings_for_algorithms(const Config& cfg,
                                                       const std::vector<std::string>& algos,
                                                       const EnvLookup& env);

// Variables of the project's own scripts and tests (COMPCOLL_VENV, ...):
// not settings of the library, so never reported as unknown.
struct ToolVar {
  const char* name;
  const char* doc;  // who reads it
};
std::span<const ToolVar> tool_variables();

// Optimal string alignment distance (Levenshtein plus adjacent
// transpositions): how far a typo is from the word meant.
size_t edit_distance(const std::string& a, const std::string& b);

// A COMPCOLL_* name in the environment that neither table knows (a typo,
// or a setting of another version): the library ignores it. suggestion is
// the nearest known name by edit distance when one is close, else "".
struct UnknownVariable {
  std::string name;
  std::string suggestion;
  // "COMPCOLL_ALGOO is not a compcoll variable and is ignored; did you mean
  // COMPCOLL_ALGO?"
  std::string message() const;
};
// entries: environ's "NAME=value" strings (a bare "NAME" works too).
std::vector<UnknownVariable> unknown_variables(const std::vector<std::string>& entries);
std::vector<UnknownVariable> unknown_variables_in_environment();  // this process's

// For an integration that leaves the application's own backend in place
// while compression is off (COMPCOLL_ALGO unset, empty or dense): the
// PyTorch autoload (torch's gloo and NCCL groups stay torch's) and the NCCL
// interposer (every call goes to NCCL). Such a process reads none of its
// other COMPCOLL_* variables, so a user who set them (or mistyped
// COMPCOLL_ALGO) would get nothing without a word. One message naming them,
// and the ones that are not compcoll's with the nearest name, or "" when
// entries set none. what_runs says what runs instead ("this 'gloo' group is
// torch's own"); read_anyway, the variables the integration reads even so
// (the interposer's COMPCOLL_NCCL_LIBRARY, say).
std::string settings_unread_while_off(const std::vector<std::string>& entries,
                                      const std::string& what_runs,
                                      const std::vector<std::string>& read_anyway = {});
std::string settings_unread_while_off_in_environment(
    const std::string& what_runs, const std::vector<std::string>& read_anyway = {});

// unknown_variables_in_environment()'s messages the first time it is called
// in a process, nothing afterwards: every communicator calls it at creation,
// and a process that creates several (PyTorch's groups, NCCL communicators)
// warns once, since the environment is the process's.
std::vector<std::string> unknown_variable_warnings_once();

}  // namespace compcoll
