#include "plugin/config.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "collectives/host_layout.h"
#include "collectives/registry.h"
#include "collectives/sparse_allreduce.h"
#include "compcoll/error.h"

namespace compcoll {
namespace {

[[noreturn]] void reject(const ConfigVar& var, const std::string& value, const std::string& why) {
  // A stray blank ("dgc ") is invisible unquoted.
  const bool blank_at_end = !value.empty() && (std::isspace(static_cast<unsigned char>(value.front())) ||
                                               std::isspace(static_cast<unsigned char>(value.back())));
  const std::string shown = blank_at_end ? "\"" + value + "\"" : value;
  CC_THROW(kInvalidArgument, var.name, "=", shown, ": ", why, " (allowed: ", var.allowed, ")");
}

// Lower case, without surrounding blanks: how a mistyped word of a closed
// set ("DGC", "True", "dgc ") is matched to the word meant.
std::string folded(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  const size_t e = s.find_last_not_of(" \t\r\n");
  std::string out = b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "unknown value (did you mean 'dgc'?)" where value differs from one of
// words only in case or surrounding blanks (the values stay exact: the
// ranks compare them), or is one slip from a single word of at least 3
// letters, or two from one of at least 7 ("dcg", "sdgc"); else just why.
std::string with_hint(const std::string& why, const std::string& value,
                      const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    if (folded(w) == folded(value)) return why + " (did you mean '" + w + "'?)";
  }
  std::string nearest;
  int close = 0;
  for (const std::string& w : words) {
    const size_t limit = w.size() >= 7 ? 2 : w.size() >= 3 ? 1 : 0;
    if (limit > 0 && edit_distance(folded(value), folded(w)) <= limit) {
      nearest = w;
      ++close;
    }
  }
  if (close == 1) return why + " (did you mean '" + nearest + "'?)";
  return why;
}

double parse_double(const ConfigVar& var, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(value.c_str(), &end);
  // Blanks around the number are accepted on both sides (strtod skips the
  // leading ones), as a shell's quoting may leave them.
  const bool converted = end != value.c_str();
  while (*end != '\0' && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (!converted || *end != '\0') reject(var, value, "not a finite number");
  if (errno == ERANGE) reject(var, value, "too small or too large for a double");
  if (!std::isfinite(d)) reject(var, value, "not a finite number");
  return d;
}

long long parse_int(const ConfigVar& var, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  const bool converted = end != value.c_str();
  while (*end != '\0' && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (!converted || *end != '\0') reject(var, value, "not an integer");
  if (errno == ERANGE) reject(var, value, "out of the range of a 64-bit integer");
  return v;
}

bool parse_bool(const ConfigVar& var, const std::string& value) {
  // Any case ("TRUE"): the ranks compare the parsed value, not the text.
  const std::string v = folded(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  reject(var, value,
         with_hint("not a boolean", value, {"1", "true", "yes", "on", "0", "false", "no", "off"}));
}

// The value must be one of the '|'-separated words of var.allowed.
// A variable that takes "auto" beside a number or a boolean: "AUTO" or
// " auto" is refused (the ranks compare values as given) with the word
// meant, not as "not a number".
void refuse_misspelt_auto(const ConfigVar& var, const std::string& value) {
  if (value != "auto" && folded(value) == "auto") {
    reject(var, value, "unknown value (did you mean 'auto'?)");
  }
}

void check_enum(const ConfigVar& var, const std::string& value) {
  std::stringstream ss(var.allowed);
  std::string word;
  std::vector<std::string> words;
  while (std::getline(ss, word, '|')) {
    if (word == value) return;
    words.push_back(word);
  }
  reject(var, value, with_hint("unknown value", value, words));
}

double fraction_in_unit(const ConfigVar& var, const std::string& value) {
  const double d = parse_double(var, value);
  if (!(d > 0.0 && d <= 1.0)) reject(var, value, "out of range");
  return d;
}

// A double in [lo, hi] (hi_closed) or [lo, hi).
double double_in_range(const ConfigVar& var, const std::string& value, double lo, double hi,
                       bool hi_closed) {
  const double d = parse_double(var, value);
  if (!(d >= lo && (hi_closed ? d <= hi : d < hi))) reject(var, value, "out of range");
  return d;
}

double non_negative(const ConfigVar& var, const std::string& value) {
  const double d = parse_double(var, value);
  if (d < 0.0) reject(var, value, "negative");
  return d;
}

long long int_at_least(const ConfigVar& var, const std::string& value, long long lo,
                       long long hi = std::numeric_limits<long long>::max()) {
  const long long v = parse_int(var, value);
  if (v < lo) reject(var, value, "out of range");
  if (v > hi) reject(var, value, "above " + std::to_string(hi));
  return v;
}

// Settings stored in an int must fit one (the timeout too: it then also
// fits a steady_clock deadline, in nanoseconds, for 290 years).
constexpr long long kIntMax = std::numeric_limits<int>::max();

// The sparsifier in use is sbc (COMPCOLL_ALGO=sbc, or auto over it).
bool sbc_in_use(const Config& cfg) {
  const auto in_use = algorithms_in_use(cfg);
  return std::find(in_use.begin(), in_use.end(), "sbc") != in_use.end();
}

// Conditional readers (ConfigVar::idle_because).

const char* idle_without_warmup(const Config& cfg) {
  return cfg.params.warmup_steps == 0 ? "with COMPCOLL_WARMUP_STEPS=0: there is no warm-up to shape"
                                      : nullptr;
}

// Without a momentum of its own and none taken from the optimizer, nothing
// is corrected or masked. Only the PyTorch backend's groups take one (an
// optimizer is theirs to see), and only with COMPCOLL_MOMENTUM_HANDOVER=auto.
const char* idle_without_momentum(const Config& cfg) {
  if (cfg.params.momentum != 0.0f) return nullptr;
  if (!cfg.params.momentum_from_optimizer) {
    return "with COMPCOLL_MOMENTUM=0 and COMPCOLL_MOMENTUM_HANDOVER=0: there is no momentum "
           "correction";
  }
  return cfg.front_end != FrontEnd::kTorchBackend
             ? "with COMPCOLL_MOMENTUM=0 outside the PyTorch backend (whose groups take the "
               "optimizer's momentum): there is no momentum correction"
             : nullptr;
}

// dgc's normalized selection (its second-moment pass) runs on one thread.
const char* idle_with_normalized_selection(const Config& cfg) {
  return cfg.params.selection == Selection::kNormalized
             ? "with COMPCOLL_SELECTION=normalized: the normalized encode runs on one thread"
             : nullptr;
}

// dgc's entry settings reach sbc only through its exact warm-up.
const char* idle_for_binary_sbc(const Config& cfg) {
  if (!sbc_in_use(cfg) || cfg.params.sbc_runs_exact_warmup()) return nullptr;
  return "for sbc without its exact warm-up (COMPCOLL_SBC_WARMUP=binary or "
         "COMPCOLL_WARMUP_STEPS=0): its binarised steps pick by magnitude and send positions "
         "and one mean per side";
}

// Only dgc and sdagc have a choice of pattern. sbc refuses scatter (a
// change: an error), and allgather or auto leave it as it is.
const char* idle_for_sbc_pattern(const Config& cfg) {
  return sbc_in_use(cfg) && cfg.params.sparse_pattern != SparsePattern::kScatter
             ? "for sbc: allgather is its only pattern"
             : nullptr;
}

// A host id only places ranks for the hierarchy, and for the NCCL
// interposer's COMPCOLL_NCCL_COMMS=multi-host.
const char* idle_without_hierarchy(const Config& cfg) {
  const bool comms_by_host =
      cfg.nccl_multi_host_only && cfg.front_end == FrontEnd::kNcclInterposer;
  return cfg.hierarchy == "off" && !comms_by_host
             ? "with COMPCOLL_HIERARCHY=off: no host is formed"
             : nullptr;
}

#define CC_APPLY [](const ConfigVar& var, const std::string& value, Config& cfg)

// Kept in one place so that compcoll-info, docs/ and the tests agree.
const ConfigVar kTable[] = {
    {"COMPCOLL_ALGO", VarType::kEnum, "", "a registered algorithm (compcoll-info lists them)",
     "compression algorithm for eligible allreduces; unset or dense = off. On a world of one "
     "rank a compressing algorithm saves nothing and still runs (WARN once); auto stays exact there",
     CC_APPLY {
       bool known = false;  // the registry is the one list of algorithms
       std::vector<std::string> names;
       for (const auto& a : algorithm_table()) {
         known = known || value == a.name;
         names.emplace_back(a.name);
       }
       if (!known) {
         reject(var, value,
                with_hint("unknown algorithm", value, names) + "; registered: " + algorithm_names());
       }
       cfg.algo = value;
     },
     "", nullptr, bit(FrontEnd::kBenchmark), "its rows are the algorithms of its --algo flag"},
    {"COMPCOLL_AUTO_ALGO", VarType::kEnum, "dgc", "a registered compressed algorithm",
     "the algorithm COMPCOLL_ALGO=auto weighs against dense on every call",
     CC_APPLY {
       bool known = false;
       for (const auto& a : algorithm_table()) {
         known = known || (value == a.name && value != "auto" && value != "dense");
       }
       if (!known) {
         std::string compressed;
         for (const auto& a : algorithm_table()) {
           if (std::string_view(a.name) == "auto" || std::string_view(a.name) == "dense") continue;
           compressed += (compressed.empty() ? "" : ", ") + std::string(a.name);
         }
         reject(var, value, "not a compressed algorithm; it must be one of " + compressed);
       }
       cfg.params.auto_algo = value;
     },
     "auto"},
    {"COMPCOLL_DENSITY", VarType::kDouble, "auto", "auto or (0, 1]",
     "fraction of elements sent per step by dgc, sbc and sdagc; auto = a byte budget: dgc and "
     "sdagc send what 0.006 costs at the default fp8 values and rice indices (1.6x DGC's 0.001 "
     "at 8 bytes an entry; about 0.0032 at fp16 + varint, 0.0016 at fp32 and u32), sbc 0.002 "
     "(its entries stay under that budget; docs/convergence.md)",
     CC_APPLY {
       refuse_misspelt_auto(var, value);
       cfg.params.density = value == "auto" ? kAutoDensity : fraction_in_unit(var, value);
     },
     "dgc,sbc,sdagc"},
    {"COMPCOLL_MOMENTUM", VarType::kDouble, "0", "[0, 1)",
     "momentum correction factor (dgc, sdagc, sbc, csc); it replaces the optimizer's momentum, "
     "so set the optimizer's momentum to 0 when you set this (or keep it equal and set "
     "COMPCOLL_MOMENTUM_HANDOVER=1); the PyTorch backend says once at WARN when the optimizer "
     "does not fit (docs/pytorch.md)",
     CC_APPLY {
       const float m = static_cast<float>(double_in_range(var, value, 0.0, 1.0, false));
       // Stored in single precision: a value that rounds to 1 there is 1.
       if (m >= 1.0f) reject(var, value, "out of range (it rounds to 1 in single precision)");
       cfg.params.momentum = m;
     },
     "dgc,sdagc,sbc,csc"},
    {"COMPCOLL_NESTEROV", VarType::kBool, "0", "0|1", "Nesterov form of the momentum correction",
     CC_APPLY { cfg.params.nesterov = parse_bool(var, value); },
     "dgc,sdagc,sbc,csc", idle_without_momentum},
    {"COMPCOLL_MOMENTUM_MASKING_DENSITY", VarType::kDouble, "auto", "auto or [0, 1]",
     "with a momentum correction: momentum factor masking (the velocity restarts at zero where a "
     "value was sent) applies at steps whose density, warm-up included, is at most this (csc: its "
     "chunk fraction); 1 = always (DGC), 0 = never; auto = 1 with COMPCOLL_MOMENTUM; with the "
     "momentum taken from the optimizer, 1 under Adam (beta1 moved) for dgc, sdagc and sbc, and "
     "2 x COMPCOLL_DENSITY (late in the warm-up: for dgc and sdagc at their default density its "
     "last 23% with the smooth shape, its 0.39% stage with stages; csc: 2 x "
     "COMPCOLL_CSC_FRACTION, after its warm-up) under SGD's hand-over and for csc (docs/convergence.md)",
     CC_APPLY {
       refuse_misspelt_auto(var, value);
       cfg.params.momentum_masking_density =
           value == "auto" ? -1.0 : double_in_range(var, value, 0.0, 1.0, true);
     },
     "dgc,sdagc,sbc,csc", idle_without_momentum},
    {"COMPCOLL_MOMENTUM_HANDOVER", VarType::kEnum, "auto", "0|1|auto",
     "keep the optimizer's SGD momentum m and hand it s_t - m*s_(t-1), so that its buffer equals "
     "DGC's corrected velocity (dgc, sdagc, sbc, csc). 1: with COMPCOLL_MOMENTUM=m. auto: under the "
     "PyTorch backend with COMPCOLL_MOMENTUM=0, at the script's first optimizer step, when every "
     "rank agrees: torch.optim.SGD with one momentum m > 0, no dampening, not Nesterov is handed "
     "over; torch.optim.Adam/AdamW with one beta1 > 0, not amsgrad, has beta1 moved into the "
     "momentum correction (the optimizer runs with beta1 = 0; its state_dict() keeps the "
     "script's); otherwise (no momentum, other optimizers, other front ends) nothing changes "
     "(docs/convergence.md)",
     CC_APPLY {
       refuse_misspelt_auto(var, value);
       cfg.params.momentum_from_optimizer = value == "auto";
       cfg.params.momentum_handover = value != "auto" && parse_bool(var, value);
     },
     "dgc,sdagc,sbc,csc"},
    {"COMPCOLL_CLIP", VarType::kDouble, "0", ">= 0",
     "local gradient clipping: each rank clips its gradient's L2 norm to CLIP/sqrt(world size); "
     "0 = off",
     CC_APPLY { cfg.params.clip = static_cast<float>(non_negative(var, value)); },
     "dgc,sdagc"},
    {"COMPCOLL_WARMUP_STEPS", VarType::kInt, "700", ">= 0",
     "warm-up of each tensor: over its first STEPS calls dgc, sdagc and sbc density falls from 25% "
     "to COMPCOLL_DENSITY (as COMPCOLL_WARMUP_SHAPE says), csc sends every chunk and onebit runs "
     "dense (700: with 500 the convergence suite's gap to dense opened in the warm-up's second "
     "half, a slower fall closed 2-3 points of it; docs/convergence.md)",
     CC_APPLY { cfg.params.warmup_steps = static_cast<int>(int_at_least(var, value, 0, kIntMax)); },
     "dgc,sdagc,sbc,csc,onebit"},
    {"COMPCOLL_WARMUP_SHAPE", VarType::kEnum, "smooth", "smooth|stages",
     "how dgc, sdagc and sbc's warm-up density falls from 25% to COMPCOLL_DENSITY: stages = x1/4 "
     "per stage, the stages (25%, 6.25%, 1.56%, ...) sharing the warm-up equally (DGC's "
     "schedule); smooth = the same fall, geometric at every step, through each stage's density at "
     "its middle (a 4x drop leaves the run behind dense for a while; docs/convergence.md)",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.warmup_shape = value == "stages" ? WarmupShape::kStages : WarmupShape::kSmooth;
     },
     "dgc,sdagc,sbc", idle_without_warmup},
    {"COMPCOLL_SBC_WARMUP", VarType::kEnum, "exact", "exact|binary",
     "what sbc sends over its warm-up (COMPCOLL_WARMUP_STEPS): exact = what dgc sends, its "
     "top-k with their values in dgc's entries (COMPCOLL_VALUE_DTYPE, COMPCOLL_INDEX_CODING) "
     "and, under COMPCOLL_DENSITY=auto, at dgc's densities, binarised (positions and one mean "
     "per side) at sbc's density only after it; binary = binarised from the first step, as the "
     "SBC paper (docs/convergence.md)",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.sbc_exact_warmup = value == "exact";
     },
     "sbc", idle_without_warmup},
    {"COMPCOLL_SBC_SIDES", VarType::kEnum, "both", "both|one",
     "what sbc's binarised steps send: both = the top density/2 of the positive and of the "
     "negative entries, each sign with its own mean (one more bit per position); one = only the "
     "sign whose top density has the larger mean magnitude, as the SBC paper (docs/convergence.md)",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.sbc_both_sides = value == "both";
     },
     "sbc"},
    {"COMPCOLL_SELECTION", VarType::kEnum, "auto", "magnitude|normalized|auto",
     "what dgc and sdagc (and sbc's exact warm-up) rank the residual by: magnitude = |v|; "
     "normalized = |v| / sqrt(s), s a moving average (beta 0.999) of the element's squared "
     "gradient, which is how far Adam would move it (one more float of state per element, and a "
     "slower encode); auto = normalized once Adam's beta1 is moved into compcoll "
     "(COMPCOLL_MOMENTUM_HANDOVER=auto under the PyTorch backend), else magnitude. With masking "
     "at every step under Adam it took lm's dgc from +2.5 % to +1.0 % of dense's loss "
     "(docs/convergence.md, \"Masking under Adam\")",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.selection = value == "magnitude"    ? Selection::kMagnitude
                              : value == "normalized" ? Selection::kNormalized
                                                      : Selection::kAuto;
     },
     "dgc,sdagc,sbc", idle_for_binary_sbc},
    {"COMPCOLL_MIN_ELEMS", VarType::kInt, "16384", ">= 0",
     "tensors with fewer elements take the exact dense path",
     CC_APPLY { cfg.min_elems = static_cast<size_t>(int_at_least(var, value, 0)); },
     kTunesCompressed},
    {"COMPCOLL_TORCH_SCOPE", VarType::kEnum, "backward", "backward|all",
     "which allreduces the PyTorch backend may compress: backward = those issued during a "
     "backward pass (DDP's gradient buckets and comm hooks, and what a compcoll operation's "
     "callbacks issue, and those in compcoll.gradient_scope(), where DDP's Join shadows "
     "them); any other takes the exact dense path, and its group's rank 0 says so once: an "
     "allreduce of values (parameters being averaged, evaluation results, "
     "activations) would lose most of its entries to sparsification. all = every eligible "
     "allreduce (a loop of your own that allreduces .grad after backward()). Under either, "
     "a group that carries DTensor's tensor parallelism (activations in forward, their "
     "gradients in backward) keeps every allreduce exact, said once at INFO. The C API and "
     "the NCCL interposer compress every eligible allreduce, a tensor-parallel layer's too "
     "(the interposer's COMPCOLL_NCCL_COMMS=multi-host leaves out communicators within a host)",
     CC_APPLY {
       check_enum(var, value);
       cfg.torch_scope_all = value == "all";
     },
     kTunesCompressed, nullptr, kHostFrontEnds | bit(FrontEnd::kNcclInterposer),
     "it is the PyTorch backend's: the others have no notion of a backward pass and compress "
     "every eligible allreduce"},
    {"COMPCOLL_CSC_CHUNK", VarType::kInt, "16384", ">= 1", "csc chunk size in elements",
     CC_APPLY { cfg.params.csc_chunk = static_cast<size_t>(int_at_least(var, value, 1)); },
     "csc"},
    {"COMPCOLL_CSC_FRACTION", VarType::kDouble, "0.01", "(0, 1]",
     "fraction of chunks csc sends per step, at least one: a tensor of fewer than 1/fraction "
     "chunks sends more (one of one chunk, below COMPCOLL_CSC_CHUNK elements: all of it)",
     CC_APPLY { cfg.params.csc_fraction = fraction_in_unit(var, value); },
     "csc"},
    {"COMPCOLL_ONEBIT_BLOCK", VarType::kInt, "2048", "power of two in [8, 16777216]",
     "elements per onebit scale",
     CC_APPLY {
       const long long b = parse_int(var, value);
       if (b < 8 || b > (1 << 24) || !std::has_single_bit(static_cast<unsigned long long>(b))) {
         reject(var, value, "not a power of two in range");
       }
       cfg.params.onebit_block = static_cast<size_t>(b);
     },
     "onebit"},
    {"COMPCOLL_ONEBIT_SCALE", VarType::kEnum, "mean", "mean|pair",
     "onebit reconstruction: mean magnitude per block, or Seide's mean-of-positives / "
     "mean-of-negatives pair",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.onebit_scale = value == "pair" ? ScaleMode::kSignedMeans : ScaleMode::kMeanMagnitude;
     },
     "onebit"},
    {"COMPCOLL_ONEBIT_RESIDUAL_BOUND", VarType::kDouble, "0.5", ">= 0",
     "onebit: each element's error-feedback residual is kept within this many times its block's "
     "scale (the excess is dropped: no wind-up of elements above the scale); 0 = unbounded",
     CC_APPLY { cfg.params.onebit_residual_bound = static_cast<float>(non_negative(var, value)); },
     "onebit"},
    {"COMPCOLL_VALUE_DTYPE", VarType::kEnum, "fp8", "fp32|fp16|bf16|fp8",
     "how dgc/sdagc values travel, and sbc's over its exact warm-up: fp8 = E4M3 behind a "
     "power-of-two scale per payload (rounding error, and the excess of a finite value beyond "
     "the type's range, stay in the residual; Inf and NaN travel as such)",
     CC_APPLY {
       check_enum(var, value);
       const auto t = value_type_from_name(value);
       if (!t) reject(var, value, "unknown value");  // the allowed list names one the codec lacks
       cfg.params.values = *t;
     },
     "dgc,sdagc,sbc", idle_for_binary_sbc},
    {"COMPCOLL_INDEX_CODING", VarType::kEnum, "rice", "u32|varint|rice",
     "how dgc/sdagc indices travel, and sbc's over its exact warm-up: raw 32-bit, LEB128 gaps, "
     "or Golomb-Rice gaps (about log2(1/density) + 2 bits each)",
     CC_APPLY {
       check_enum(var, value);
       const auto t = index_type_from_name(value);
       if (!t) reject(var, value, "unknown value");  // the allowed list names one the codec lacks
       cfg.params.indices = *t;
     },
     "dgc,sdagc,sbc", idle_for_binary_sbc},
    {"COMPCOLL_SAMPLE_FRACTION", VarType::kDouble, "0.01", "(0, 1]",
     "share of elements dgc and sbc sample to set their threshold",
     CC_APPLY { cfg.params.sample_fraction = fraction_in_unit(var, value); },
     "dgc,sbc"},
    {"COMPCOLL_CODEC_THREADS", VarType::kInt, "auto", "auto or 1 to 64",
     "threads for dgc's encode pass (momentum, accumulation, candidates), each over at least "
     "262144 elements; the same bits for any number, so ranks may differ. auto = 1 where "
     "compcoll compresses host tensors (CPU training, whose cores run the backward pass beside "
     "the allreduce); where it stages GPU tensors through host memory (the NCCL interposer, the "
     "PyTorch backend's cuda lane), whose host cores are otherwise idle, the CPUs of the rank's "
     "machine shared among its ranks, at most 8 (docs/gpu.md)",
     CC_APPLY {
       refuse_misspelt_auto(var, value);
       cfg.params.codec_threads =
           value == "auto" ? kAutoCodecThreads : static_cast<int>(int_at_least(var, value, 1, 64));
     },
     "dgc", idle_with_normalized_selection},
    {"COMPCOLL_DEVICE_CODECS", VarType::kEnum, "off", "on|off",
     "the NCCL interposer's compressed calls on device memory: on = dgc, sdagc and sbc run "
     "the GPU codecs where the tensor lies (the allgather pattern, no host hierarchy, "
     "magnitude selection; the same bits as staging through host memory, without the copies "
     "and the CPU codec); a call they cannot take is staged, and the log says why at INFO; "
     "where they cannot run at all (no CUDA device, a build without nvcc, normalized "
     "selection, sbc with COMPCOLL_MOMENTUM), it says so once at WARN; while a loss scaler "
     "is in charge every call is staged, which can undo an overflowed step. "
     "off = every compressed call is staged through host memory and the CPU codec. Off by "
     "default until the route has run on a GPU (docs/gpu.md, \"The device route\")",
     CC_APPLY {
       check_enum(var, value);
       cfg.device_codecs = value == "on";
     },
     "dgc,sdagc,sbc", nullptr, kHostFrontEnds | bit(FrontEnd::kTorchBackend),
     "only the NCCL interposer runs the GPU codecs: the C API and the benchmark take host "
     "buffers, and the PyTorch backend stages cuda tensors through host memory (docs/gpu.md)"},
    {"COMPCOLL_SPARSE_PATTERN", VarType::kEnum, "auto", "allgather|scatter|auto",
     "how dgc/sdagc payloads move: allgather (every rank receives all P payloads), scatter "
     "(index-region owners reduce and re-select; O(k) bytes per rank whatever P; "
     "docs/scaling.md), or auto (the one the cost model predicts faster for P, k and the link "
     "measured at start); sbc is allgather only and refuses scatter",
     CC_APPLY {
       check_enum(var, value);
       cfg.params.sparse_pattern = value == "scatter"     ? SparsePattern::kScatter
                                   : value == "allgather" ? SparsePattern::kAllgather
                                                          : SparsePattern::kAuto;
     },
     "dgc,sdagc,sbc", idle_for_sbc_pattern},
    {"COMPCOLL_TRANSPORT", VarType::kEnum, "tcp", "tcp",
     "Gloo device. ibverbs (RDMA) is refused: Debian's Gloo has no unbound buffers on its "
     "ibverbs device, and compcoll's collectives need them",
     CC_APPLY {
       // Refused here, not only when connecting, so that compcoll-info and
       // every integration report it before any rendezvous.
       if (value == "ibverbs") {
         reject(var, value,
                "not available in this build: Gloo's ibverbs device (Debian's libgloo) has no "
                "unbound-buffer support, which compcoll's collectives need; use tcp");
       }
       check_enum(var, value);
       cfg.transport = value;
     },
     "", nullptr, kFrameworkGivesIt},
    {"COMPCOLL_IFACE", VarType::kString, "", "a network interface name",
     "network interface the tcp device binds to (e.g. eth0)",
     CC_APPLY { cfg.iface = value; }, "", nullptr, kFrameworkGivesIt},
    {"COMPCOLL_HOSTNAME", VarType::kString, "", "a hostname or address",
     "address the tcp device binds to (instead of COMPCOLL_IFACE)",
     CC_APPLY { cfg.hostname = value; }, "", nullptr, kFrameworkGivesIt},
    {"COMPCOLL_RENDEZVOUS", VarType::kString, "", "file://DIR|redis://HOST:PORT[/JOB]",
     "where ranks meet: a shared directory or a Redis server, fresh for each job (a "
     "directory, or a server without /JOB, that an earlier job met in is refused: its keys are "
     "still there); /JOB (letters, digits, _ - .) puts a job's keys under its own name, so jobs "
     "can share one server",
     CC_APPLY {
       if (value.rfind("file://", 0) != 0 && value.rfind("redis://", 0) != 0) {
         reject(var, value, "not a file:// or redis:// address");
       }
       cfg.rendezvous = value;
     },
     "", nullptr, kFrameworkGivesIt | bit(FrontEnd::kBenchmark)},
    {"COMPCOLL_RANK", VarType::kInt, "", ">= 0 (falls back to RANK)", "this process's rank",
     CC_APPLY { cfg.rank = static_cast<int>(int_at_least(var, value, 0, kIntMax - 1)); }, "",
     nullptr, kFrameworkGivesIt | bit(FrontEnd::kBenchmark)},
    {"COMPCOLL_WORLD_SIZE", VarType::kInt, "", ">= 1 (falls back to WORLD_SIZE)",
     "number of ranks",
     CC_APPLY { cfg.world_size = static_cast<int>(int_at_least(var, value, 1, kIntMax)); }, "",
     nullptr, kFrameworkGivesIt | bit(FrontEnd::kBenchmark)},
    {"COMPCOLL_TIMEOUT_MS", VarType::kInt, "30000", ">= 1",
     "limit of every collective call and of rendezvous, in milliseconds",
     CC_APPLY { cfg.timeout = std::chrono::milliseconds(int_at_least(var, value, 1, kIntMax)); },
     "", nullptr, bit(FrontEnd::kTorchBackend),
     "every operation's limit is the process group's timeout (init_process_group's timeout=, "
     "torch's default 30 minutes)"},
    {"COMPCOLL_HIERARCHY", VarType::kEnum, "auto", "off|host|shards|auto",
     "two-level host hierarchy for compressed calls: each host's ranks sum densely over shared "
     "memory, one leader per host runs COMPCOLL_ALGO between hosts and shares the result back "
     "(error feedback on the leaders only; docs/scaling.md); host = wherever some host has "
     "several ranks (with one rank per host it would change nothing: WARN, flat; with every rank "
     "on one host the lone leader compresses for no peer: WARN); shards = the "
     "same, with "
     "every tensor cut into S slices (S = the smallest host's ranks) and local rank j leading "
     "slice j between the hosts' j-th ranks, each keeping its slice's error feedback (Gloo "
     "subgroups and two ranks on every host needed, else it runs as host: WARN); auto = host "
     "when some host "
     "has several ranks, there are several hosts, and some machine's ranks outnumber the CPUs "
     "they may use (with a core per rank the ranks compress in parallel faster than their leaders "
     "would alone)",
     CC_APPLY {
       check_enum(var, value);
       cfg.hierarchy = value;
     },
     kTunesCompressed},
    {"COMPCOLL_HOST_ID", VarType::kString, "", "a string of 1 to 256 bytes",
     "this rank's host for COMPCOLL_HIERARCHY; ranks with equal ids must share /dev/shm; unset = "
     "the kernel's boot id, the network namespace and the /dev/shm mounted (hostnames are not "
     "enough: namespaces share them; containers on the host's network mount their own "
     "/dev/shm)",
     CC_APPLY {
       if (value.size() > kMaxHostIdBytes) reject(var, value, "longer than 256 bytes");
       cfg.host_id = value;
     },
     kTunesCompressed, idle_without_hierarchy},
    {"COMPCOLL_DEBUG", VarType::kEnum, "WARN", "WARN|INFO|TRACE",
     "log level of 'compcoll INFO ...' lines on stderr (like NCCL_DEBUG)",
     CC_APPLY {
       // Any case, as NCCL_DEBUG: a log level's spelling should not stop a job.
       std::string level = folded(value);
       for (char& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
       check_enum(var, level == "WARN" || level == "INFO" || level == "TRACE" ? level : value);
       cfg.debug = level == "TRACE" ? LogLevel::kTrace : level == "INFO" ? LogLevel::kInfo : LogLevel::kWarn;
     }},
    {"COMPCOLL_STATS_FILE", VarType::kString, "", "a path; {rank} is replaced by the rank",
     "where each rank writes its JSON stats at communicator destruction or exit; its "
     "directory is created when missing, and a path that cannot be written fails every rank "
     "at creation, not at exit; a second live communicator of the same rank in one process "
     "(C API) writes <name>-comm2<.ext> beside it (WARN); without {rank} every rank writes the "
     "one file and the last to finish wins (WARN, once per process that is a communicator's rank 0); "
     "the PyTorch backend and the NCCL "
     "interposer write one file per process",
     CC_APPLY { cfg.stats_file = value; }, "", nullptr, bit(FrontEnd::kBenchmark),
     "it runs the algorithms without the C API, PyTorch or NCCL front ends that write the file "
     "(its --json has the figures)"},
    {"COMPCOLL_STATE_DIR", VarType::kString, "", "a directory",
     "error-feedback state survives restarts: each rank loads its residuals from DIR when its "
     "communicator is created (if rank, world size and configuration match, on every rank: "
     "else a WARN, the old files moved to <file>.unused and a fresh start for all; a restored "
     "file is moved to <file>.restored, so that a run that fails before saving leaves no older "
     "state to restore again) and saves them there at destruction "
     "or exit; DIR is created when missing, "
     "and one that cannot be created or written fails every rank at creation, not at exit",
     CC_APPLY { cfg.state_dir = value; }, "", nullptr, bit(FrontEnd::kBenchmark),
     "every run starts its algorithms fresh, so that its rows time the same calls"},
    {"COMPCOLL_NCCL_COMMS", VarType::kEnum, "all", "all|multi-host",
     "which NCCL communicators the NCCL interposer compresses: all = every one; multi-host = "
     "only those whose ranks span several hosts (as COMPCOLL_HIERARCHY finds hosts; "
     "COMPCOLL_HOST_ID), decided with the other ranks at a communicator's first eligible "
     "allreduce, and said at INFO. The interposer cannot tell activations from gradients: with "
     "multi-host a job whose tensor-parallel groups lie within a node (Megatron's layout) keeps "
     "their allreduces exact while its data-parallel groups, which cross nodes, are compressed; "
     "a job on one node then compresses nothing (WARN at exit; docs/gpu.md)",
     CC_APPLY {
       check_enum(var, value);
       cfg.nccl_multi_host_only = value == "multi-host";
     },
     kTunesCompressed, nullptr, kHostFrontEnds | bit(FrontEnd::kTorchBackend),
     "it chooses the NCCL interposer's communicators; the PyTorch backend keeps "
     "tensor-parallel groups exact by itself (COMPCOLL_TORCH_SCOPE)"},
    {"COMPCOLL_NCCL_LIBRARY", VarType::kString, "libnccl.so.2", "a library name or path",
     "the real NCCL that the NCCL interposer (libcompcoll_nccl.so) loads and forwards to",
     CC_APPLY { cfg.nccl_library = value; }, "", nullptr,
     kHostFrontEnds | bit(FrontEnd::kTorchBackend),
     "only the NCCL interposer loads NCCL itself; the PyTorch backend's cuda lane uses the NCCL "
     "that torch loaded"},
    {"COMPCOLL_CUDA_LIBRARY", VarType::kString, "libcuda.so.1", "a library name or path",
     "the CUDA driver library the NCCL interposer loads",
     CC_APPLY { cfg.cuda_library = value; }, "", nullptr,
     kHostFrontEnds | bit(FrontEnd::kTorchBackend),
     "only the NCCL interposer loads the CUDA driver itself"},
};

#undef CC_APPLY

}  // namespace

std::vector<std::string_view> algorithms_in_use(const Config& cfg) {
  if (!cfg.compression_enabled()) return {};
  if (cfg.algo == "auto") return {"auto", cfg.params.auto_algo};
  return {cfg.algo};
}

const char* var_type_name(VarType t) {
  switch (t) {
    case VarType::kEnum: return "enum";
    case VarType::kDouble: return "double";
    case VarType::kInt: return "int";
    case VarType::kBool: return "bool";
    case VarType::kString: return "string";
  }
  return "?";
}

std::span<const ConfigVar> config_table() { return kTable; }

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup env_read_by(FrontEnd fe, EnvLookup env) {
  return [fe, env = std::move(env)](const char* name) -> std::optional<std::string> {
    std::string_view n = name;
    if (n == "RANK") n = "COMPCOLL_RANK";  // a fallback goes with its variable
    if (n == "WORLD_SIZE") n = "COMPCOLL_WORLD_SIZE";
    for (const ConfigVar& var : kTable) {
      if (n == var.name && (var.ignored_by & bit(fe)) != 0) return std::nullopt;
    }
    return env(name);
  };
}

Config load_config(const EnvLookup& env) {
  Config cfg;
  // Where the rank and world size came from: a launcher's RANK/WORLD_SIZE
  // when the COMPCOLL_ ones are unset, and an error names what was set.
  std::string rank_from = "COMPCOLL_RANK", size_from = "COMPCOLL_WORLD_SIZE";
  for (const ConfigVar& var : kTable) {
    const std::string name = var.name;
    std::optional<std::string> value = env(var.name);
    const char* fallback = name == "COMPCOLL_RANK"         ? "RANK"
                           : name == "COMPCOLL_WORLD_SIZE" ? "WORLD_SIZE"
                                                           : nullptr;
    if ((!value || value->empty()) && fallback != nullptr) {
      value = env(fallback);
      if (value && !value->empty()) {
        (name == "COMPCOLL_RANK" ? rank_from : size_from) = fallback;
        try {
          var.apply(var, *value, cfg);
        } catch (const Error& e) {
          CC_THROW(kInvalidArgument, message_without_prefix(e), " (read from ", fallback,
                   ", since ", name, " is unset)");
        }
        continue;
      }
    }
    if (!value || value->empty()) {
      if (*var.default_value) var.apply(var, var.default_value, cfg);
      continue;
    }
    var.apply(var, *value, cfg);
  }
  CC_CHECK(cfg.rank < 0 || cfg.world_size < 0 || cfg.rank < cfg.world_size, kInvalidArgument,
           rank_from, "=", cfg.rank, " is not below ", size_from, "=", cfg.world_size);
  // Settings valid alone and refused together: here, so that compcoll-info
  // refuses them as every front end's first compressed call would.
  const bool sbc = cfg.algo == "sbc" || (cfg.algo == "auto" && cfg.params.auto_algo == "sbc");
  CC_CHECK(!sbc || cfg.params.sparse_pattern != SparsePattern::kScatter, kInvalidArgument,
           kSbcRefusesScatter);
  return cfg;
}

TimeoutError naming_timeout_setting(const TimeoutError& e, const Config& cfg,
                                    std::string_view advice) {
  // A front end that takes the timeout from its framework (the PyTorch
  // backend: the process group's) never read the variable.
  const auto table = config_table();
  const auto var = std::find_if(table.begin(), table.end(), [](const ConfigVar& v) {
    return std::string_view(v.name) == "COMPCOLL_TIMEOUT_MS";
  });
  const bool read = var != table.end() && (var->ignored_by & bit(cfg.front_end)) == 0;
  if (!read || e.limit() != cfg.timeout) return e;
  // Named once: a caller above a layer that named it already (the bench
  // around a Communicator) leaves it as it is.
  if (std::string_view(e.what()).find(" sets this limit; ") != std::string_view::npos) return e;
  return TimeoutError(detail::concat(e.what(), " (COMPCOLL_TIMEOUT_MS=", cfg.timeout.count(),
                                     " sets this limit; ", advice, ")"),
                      e.limit());
}

std::string Config::agreement_description() const {
  Config agreed = *this;
  for (const ConfigVar& var : config_table()) {
    if (*var.default_value == '\0') continue;  // unset by default: a setting of the communicator
    // A setting this front end does not read (COMPCOLL_TORCH_SCOPE under the
    // C API, said to change nothing) is not the ranks' to agree on either.
    const bool unread = (var.ignored_by & bit(front_end)) != 0;
    const bool idle = unread || !tunes(var, *this) ||
                      (var.idle_because != nullptr && var.idle_because(*this));
    if (idle) var.apply(var, var.default_value, agreed);
  }
  // state_dir: whether ranks load checkpoints at creation (a collective
  // step); where they keep them is each rank's own business.
  // torch_scope: a rank that compresses a call its peers send exact would
  // not meet them (said only when not the default, as state_dir); the same
  // for nccl_comms, which decides whether a communicator compresses.
  return "algo=" + agreed.algo + ";min_elems=" + std::to_string(agreed.min_elems) +
         ";hierarchy=" + agreed.hierarchy + ";" + agreed.params.canonical() +
         (agreed.state_dir.empty() ? "" : ";state_dir=on") +
         (agreed.torch_scope_all ? ";torch_scope=all" : "") +
         (agreed.nccl_multi_host_only ? ";nccl_comms=multi-host" : "");
}

}  // namespace compcoll
