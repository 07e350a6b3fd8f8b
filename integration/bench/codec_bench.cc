#include "integration/bench/codec_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "compression/csc.h"
#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/onebit.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"
#include "integration/bench/args.h"
#include "integration/bench/gradients.h"
#include "integration/bench/json.h"
#include "plugin/config.h"

namespace compcoll::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// What to run. The codec's settings are the library's (`params`: the
// configuration table's defaults and the COMPCOLL_* environment, as
// load_config reads them), with the flags applied over them, so that the
// table shows what an allreduce with the same environment would encode.
struct Options {
  std::string algo;
  size_t count = 0;
  AlgoParams params;
  // --density: overrides every requested codec's; NaN: the library's for
  // each (density_for: elements for dgc, sdagc and sbc; csc's chunk fraction).
  double density = NAN;
  int iters = 5;
  GradientKind dist = GradientKind::kGaussian;
  uint64_t seed = 1;
};

// One encode and one decode of a codec, on buffers the caller owns.
struct CodecUnderTest {
  std::function<void()> encode;        // grad -> payload, state updated
  std::function<void(float*)> decode;  // payload -> accumulate into out
  std::function<size_t()> payload_bytes;
  std::function<size_t()> sent;        // entries (sparse) or elements (dense-ish) sent
  double density = 0.0;
};

CodecUnderTest make_sparse(std::unique_ptr<SparseCodec> codec, const float* grad, size_t n,
                           double density) {
  auto shared = std::shared_ptr<SparseCodec>(std::move(codec));
  auto state = std::shared_ptr<CodecState>(shared->make_state(n));
  auto payload = std::make_shared<Bytes>();
  auto info = std::make_shared<EncodeInfo>();
  CodecUnderTest c;
  c.density = density;
  c.encode = [=] { *info = shared->encode(grad, n, *state, *payload); };
  c.decode = [=](float* out) { decode_accumulate(*payload, out, n); };
  c.payload_bytes = [=] { return payload->size(); };
  c.sent = [=] { return info->sent; };
  return c;
}

CodecUnderTest make_codec(const Options& o, const float* grad, size_t n) {
  AlgoParams p = o.params;
  p.warmup_steps = 0;  // the steady state: nothing warms up here
  if (o.algo == "dgc" || o.algo == "sdagc" || o.algo == "sbc") {
    if (!std::isnan(o.density)) p.density = o.density;
    // The library's own mapping from the settings to the codec (registry.h).
    std::unique_ptr<SparseCodec> codec = make_sparse_codec(o.algo, p);
    return make_sparse(std::move(codec), grad, n, density_for(o.algo, p));
  }
  if (o.algo == "csc") {
    CscConfig cfg;
    cfg.chunk = p.csc_chunk;
    cfg.fraction = std::isnan(o.density) ? p.csc_fraction : o.density;
    cfg.momentum = p.momentum;
    cfg.nesterov = p.nesterov;
    validate_csc_config(cfg);
    auto state = std::shared_ptr<CodecState>(make_csc_state(cfg, n));
    const size_t chunks = csc_chunk_count(n, cfg.chunk);
    auto norms = std::make_shared<std::vector<float>>(chunks);
    auto packed = std::make_shared<std::vector<float>>();
    auto selected = std::make_shared<std::vector<uint32_t>>();
    CodecUnderTest c;
    c.density = cfg.fraction;
    // encode: the fused accumulate + chunk norms pass (what runs before the
    // norm allreduce); selection and packing of the ~1 % chunks are cheap.
    c.encode = [=] {
      csc_accumulate_norms(cfg, grad, n, *state, norms->data());
      *selected = csc_select_chunks(norms->data(), chunks, csc_selected_count(chunks, cfg.fraction));
      csc_pack(*state, *selected, cfg.chunk, *packed);
      csc_commit(*state, *selected, cfg.chunk);
    };
    c.decode = [=](float* out) { csc_unpack(packed->data(), *selected, cfg.chunk, n, out); };
    c.payload_bytes = [=] { return (packed->size() + norms->size()) * sizeof(float); };
    c.sent = [=] { return packed->size(); };
    return c;
  }
  if (o.algo == "onebit") {
    OneBitConfig cfg{p.onebit_block, p.onebit_scale, p.onebit_residual_bound};
    validate_onebit_config(cfg);
    auto err = std::make_shared<std::vector<float>>(n, 0.0f);
    auto payload = std::make_shared<Bytes>();
    CodecUnderTest c;
    c.density = 1.0;
    c.encode = [=] { onebit_encode(cfg, grad, err->data(), n, *payload); };
    c.decode = [=](float* out) { onebit_decode(*payload, out, n, /*accumulate=*/true); };
    c.payload_bytes = [=] { return payload->size(); };
    c.sent = [=] { return n; };
    return c;
  }
  CC_THROW(kInvalidArgument, "--algo: unknown codec '", o.algo,
           "' (allowed: dgc, sbc, sdagc, csc, onebit)");
}

struct CodecResult {
  Options o;
  size_t count = 0;
  double density = 0.0;
  size_t sent = 0;
  double memcpy_ms = 0.0, encode_ms = 0.0, decode_ms = 0.0;
  size_t payload_bytes = 0;

  // Dense bytes / payload bytes. Undefined (NaN: JSON null, "n/a" in the
  // table) at --count 0, where there is nothing to compress and the payload
  // is only the codec's fixed header.
  double ratio() const {
    return count && payload_bytes ? double(count * sizeof(float)) / payload_bytes : NAN;
  }
  double vs_memcpy(double ms) const { return memcpy_ms > 0 ? ms / memcpy_ms : 0.0; }

  JsonObject json() const {
    JsonObject j;
    j.add("algo", o.algo)
        .add("count", count)
        .add("density", density)
        .add("sent", sent)
        .add("encode_ms", encode_ms)
        .add("decode_ms", decode_ms)
        .add("memcpy_ms", memcpy_ms)
        .add("encode_vs_memcpy", vs_memcpy(encode_ms))
        .add("decode_vs_memcpy", vs_memcpy(decode_ms))
        .add("payload_bytes", payload_bytes)
        .add("ratio", ratio())
        .add("momentum", double(o.params.momentum))
        .add("values", value_type_name(o.params.values))
        .add("indices", index_type_name(o.params.indices))
        .add("threads", o.algo == "dgc" ? o.params.codec_threads : 1)  // COMPCOLL_CODEC_THREADS
        .add("gradient", gradient_kind_name(o.dist))
        .add("iters", o.iters);
    return j;
  }

  void print_row() const {
    char ratio_text[32] = "n/a";
    if (!std::isnan(ratio())) std::snprintf(ratio_text, sizeof ratio_text, "%.1f", ratio());
    std::printf("  %-7s %9.4g %10zu %10.2f %8.2f %10.3f %8.3f %12zu %9s\n", o.algo.c_str(),
                density, sent, encode_ms, vs_memcpy(encode_ms), decode_ms, vs_memcpy(decode_ms),
                payload_bytes, ratio_text);
  }
};

// Each iteration times memcpy, encode and decode back to back, so the ratios
// compare like with like even when the machine's speed drifts.
CodecResult run_one(const Options& o, const std::vector<float>& grad) {
  const size_t n = grad.size();
  CodecUnderTest c = make_codec(o, grad.data(), n);
  std::vector<float> copy(n), out(n);
  if (n) std::memset(copy.data(), 0, n * sizeof(float));  // fault pages in before timing (data() may be null at 0)
  std::vector<double> t_memcpy, t_encode, t_decode;
  for (int it = -1; it < o.iters; ++it) {  // iteration -1 warms caches and state
    auto t0 = Clock::now();
    if (n) std::memcpy(copy.data(), grad.data(), n * sizeof(float));
    const double m = ms_since(t0);
    t0 = Clock::now();
    c.encode();
    const double e = ms_since(t0);
    std::fill(out.begin(), out.end(), 0.0f);
    t0 = Clock::now();
    c.decode(out.data());
    const double d = ms_since(t0);
    if (it >= 0) {
      t_memcpy.push_back(m);
      t_encode.push_back(e);
      t_decode.push_back(d);
    }
  }
  CodecResult r;
  r.o = o;
  r.count = n;
  r.density = c.density;
  r.sent = c.sent();
  r.memcpy_ms = median(t_memcpy);
  r.encode_ms = median(t_encode);
  r.decode_ms = median(t_decode);
  r.payload_bytes = c.payload_bytes();
  return r;
}

ValueType parse_values(const std::string& s) {
  if (const auto t = value_type_from_name(s)) return *t;
  CC_THROW(kInvalidArgument, "--values: '", s, "' is not one of fp32, fp16, bf16, fp8");
}

IndexType parse_indices(const std::string& s) {
  if (const auto t = index_type_from_name(s)) return *t;
  CC_THROW(kInvalidArgument, "--indices: '", s, "' is not one of u32, varint, rice");
}

ScaleMode parse_scale(const std::string& s) {
  if (s == "mean") return ScaleMode::kMeanMagnitude;
  if (s == "pair") return ScaleMode::kSignedMeans;
  CC_THROW(kInvalidArgument, "--scale: '", s, "' is not one of mean, pair");
}

Selection parse_selection(const std::string& s) {
  if (s == "normalized") return Selection::kNormalized;
  if (s == "magnitude") return Selection::kMagnitude;
  if (s == "auto") return Selection::kAuto;
  CC_THROW(kInvalidArgument, "--selection: '", s, "' is not one of magnitude, normalized, auto");
}

bool parse_sbc_sides(const std::string& s) {
  if (s == "both") return true;
  if (s == "one") return false;
  CC_THROW(kInvalidArgument, "--sbc-sides: '", s, "' is not one of both, one");
}

// Builds every requested codec once on a few elements, so that an unknown
// name or a bad setting (--density 2, --block 3, ...) fails before anything
// is printed: stdout stays empty on error instead of carrying a table header
// that, when piped, lands after the error.
void validate_codecs(Options o, const std::vector<std::string>& algos) {
  const std::vector<float> probe(std::min<size_t>(o.count, 64), 0.0f);
  for (const std::string& a : algos) {
    o.algo = a;
    make_codec(o, probe.data(), probe.size());
  }
}

}  // namespace

int codec_main(int argc, char** argv, int first) {
  Args args(argc, argv, first);
  Options o;
  const std::string algos = args.str("algo", "dgc,sbc,sdagc,csc,onebit",
                                     "codec(s), comma-separated: dgc, sbc, sdagc, csc, onebit");
  o.count = static_cast<size_t>(args.integer(
      "count", 25557032,
      "float32 elements (K/M/G suffixes); 0 times the fixed per-call cost (header only), its "
      "ratio is n/a (JSON null)"));
  // Defaults: the library's settings for this environment (a bad COMPCOLL_*
  // value fails here, as it would in an allreduce).
  AlgoParams& p = o.params;
  p = load_config().params;
  // COMPCOLL_CODEC_THREADS=auto gives host buffers one thread (only a
  // communicator staging device tensors spreads dgc's encode): this bench
  // times host buffers, so its header and rows say 1, not auto's marker.
  if (p.codec_threads == kAutoCodecThreads) p.codec_threads = 1;
  const std::string density = args.str(
      "density", "auto",
      "fraction sent, in (0, 1]: elements for dgc/sbc/sdagc, chunks for csc; auto: the library's, "
      "COMPCOLL_DENSITY (auto: dgc and sdagc what 0.006 costs at fp8 values and rice indices, "
      "converted to their value and index coding; sbc 0.002), COMPCOLL_CSC_FRACTION for csc");
  if (density != "auto") {
    // Checked here, not by the codec: 0 is the library's own marker for
    // auto, so a codec would take --density 0 silently as auto.
    char* end = nullptr;
    o.density = std::strtod(density.c_str(), &end);
    CC_CHECK(end != density.c_str() && *end == '\0' && o.density > 0.0 && o.density <= 1.0,
             kInvalidArgument, "--density: '", density,
             "' is not a fraction in (0, 1] or auto (the library's for each codec)");
  }
  p.momentum = static_cast<float>(
      args.num("momentum", p.momentum, "momentum correction factor (dgc, sdagc, sbc, csc)"));
  p.nesterov = args.flag("nesterov", "Nesterov momentum correction") || p.nesterov;
  p.values = parse_values(
      args.str("values", value_type_name(p.values), "sparse value type: fp32, fp16, bf16, fp8"));
  p.indices = parse_indices(
      args.str("indices", index_type_name(p.indices), "sparse index coding: u32, varint, rice"));
  p.csc_chunk = static_cast<size_t>(
      args.integer("chunk", static_cast<long long>(p.csc_chunk), "csc chunk size in elements"));
  p.onebit_block = static_cast<size_t>(args.integer(
      "block", static_cast<long long>(p.onebit_block), "onebit scale block size"));
  p.onebit_scale = parse_scale(args.str(
      "scale", p.onebit_scale == ScaleMode::kSignedMeans ? "pair" : "mean",
      "onebit reconstruction: mean or pair"));
  p.sbc_both_sides = parse_sbc_sides(args.str("sbc-sides", p.sbc_both_sides ? "both" : "one",
                                              "sbc: both signs with a mean each, or one"));
  p.selection = parse_selection(args.str(
      "selection", selection_name(p.selection),
      "dgc/sdagc: rank by magnitude or by normalized value (auto: magnitude here, no optimizer)"));
  const long long iters = args.integer("iters", 5, "timed iterations (median reported)");
  o.dist = parse_gradient_kind(args.str("gradient", "gaussian", "input: gaussian, t3, mixed"));
  o.seed = static_cast<uint64_t>(args.integer("seed", 1, "random seed"));
  const bool json = args.flag("json", "print JSON (an object for one codec, a list for several)");
  std::string usage;
  if (!args.finish(&usage)) {
    std::cout << "usage: compcoll-bench codec [flags]\n" << usage;
    return 0;
  }
  CC_CHECK(iters >= 1 && iters <= 1000000, kInvalidArgument,
           "--iters must be in [1, 1000000], not ", iters);
  o.iters = static_cast<int>(iters);
  const std::vector<std::string> list = split_names("algo", algos);
  validate_codecs(o, list);
  // onebit sends every sign: a --density its row ignores is said, as
  // compcoll-bench allreduce says the density its rows ignore.
  if (!std::isnan(o.density) && std::find(list.begin(), list.end(), "onebit") != list.end()) {
    std::cerr << "compcoll-bench codec: warning: --density changes nothing for onebit (it sends "
                 "every sign)"
              << (list.size() == 1 ? ", so nothing in this run" : "") << "\n";
  }
  // Every other flag given that no codec of the run reads is said too (each
  // was silent, and a table header showed "momentum correction" for onebit).
  struct FlagReaders {
    const char* flag;
    std::vector<std::string> codecs;
  };
  const std::vector<FlagReaders> readers = {
      {"momentum", {"dgc", "sdagc", "sbc", "csc"}}, {"nesterov", {"dgc", "sdagc", "sbc", "csc"}},
      {"values", {"dgc", "sdagc", "sbc"}},          {"indices", {"dgc", "sdagc", "sbc"}},
      {"chunk", {"csc"}},                           {"block", {"onebit"}},
      {"scale", {"onebit"}},                        {"sbc-sides", {"sbc"}},
      {"selection", {"dgc", "sdagc"}}};
  for (const FlagReaders& f : readers) {
    if (!args.given(f.flag)) continue;
    const bool read = std::any_of(list.begin(), list.end(), [&](const std::string& a) {
      return std::find(f.codecs.begin(), f.codecs.end(), a) != f.codecs.end();
    });
    std::string who;
    for (const std::string& c : f.codecs) who += (who.empty() ? "" : ", ") + c;
    if (!read) {
      std::cerr << "compcoll-bench codec: warning: --" << f.flag << " changes nothing for "
                << algos << " (it is read by " << who << ")\n";
    }
  }
  if (args.given("nesterov") && o.params.momentum == 0.0f) {
    std::cerr << "compcoll-bench codec: warning: --nesterov changes nothing without momentum "
                 "(--momentum or COMPCOLL_MOMENTUM)\n";
  }
  if (o.params.momentum != 0.0f &&
      std::none_of(list.begin(), list.end(), [](const std::string& a) { return a != "onebit"; })) {
    o.params.momentum = 0.0f;  // so the header does not claim a correction onebit never makes
  }
  const std::vector<float> grad = make_gradient(o.dist, o.count, o.seed);

  std::vector<JsonObject> results;
  if (!json) {
    const int threads = o.params.codec_threads;
    // Momentum correction changes what an encode does (a velocity to
    // update), so a table with it says so: two dgc tables otherwise differ
    // without a word.
    char momentum[64] = "";
    if (o.params.momentum != 0.0f) {
      std::snprintf(momentum, sizeof momentum, ", momentum correction %g%s",
                    static_cast<double>(o.params.momentum), o.params.nesterov ? " (Nesterov)" : "");
    }
    std::printf("# compcoll-bench codec: %zu float32 (%.1f MiB), %s gradient, one thread (dgc's "
                "encode pass: %d, COMPCOLL_CODEC_THREADS)%s, median of %d\n",
                o.count, o.count * 4.0 / (1 << 20), gradient_kind_name(o.dist), threads, momentum,
                o.iters);
    std::printf("# %-7s %9s %10s %10s %8s %10s %8s %12s %9s\n", "algo", "density", "sent",
                "encode_ms", "x_memcpy", "decode_ms", "x_memcpy", "payload_B", "ratio");
  }
  for (const std::string& a : list) {
    o.algo = a;
    const CodecResult r = run_one(o, grad);
    results.push_back(r.json());
    if (!json) r.print_row();
  }
  if (json) {
    std::cout << (results.size() == 1 ? results[0].str() : json_list(results)) << std::endl;
  }
  return 0;
}

CodecSpeed measure_codec(const std::string& algo, size_t count, const AlgoParams& params, int iters) {
  Options o;
  o.algo = algo;
  o.count = count;
  o.params = params;
  o.iters = iters;
  o.dist = GradientKind::kGaussian;
  o.seed = 1;
  const CodecResult r = run_one(o, make_gradient(o.dist, count, o.seed));
  return {r.encode_ms, r.decode_ms, r.memcpy_ms, r.payload_bytes, r.sent};
}

}  // namespace compcoll::bench
