// Seed corpora for the fuzz targets: a handful of small VALID inputs made by
// the real encoders (and, for the configuration parser, realistic settings),
// framed as fuzz_common.h describes. Deterministic: the same build writes the
// same bytes.
//
//   compcoll_fuzz_make_corpus DIR    writes DIR/<target>/<name> for every
//                                    target (sparse_decode, sbc_decode,
//                                    onebit_decode, decode_accumulate, config)
//
// tests/fuzz/corpus/ holds its committed output; regenerate it after a
// payload format change:
//   build-fuzz/tests/fuzz/compcoll_fuzz_make_corpus tests/fuzz/corpus
// scripts/run-fuzz.sh also regenerates into the build directory and feeds
// both to each target, so a stale committed corpus costs coverage, not
// correctness.
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "collectives/registry.h"
#include "compression/onebit.h"
#include "plugin/config.h"

using namespace compcoll;

namespace {

std::string g_root;

void make_dir(const std::string& path) { ::mkdir(path.c_str(), 0755); }

void write(const std::string& target, const std::string& name, const std::vector<uint8_t>& bytes) {
  make_dir(g_root + "/" + target);
  const std::string path = g_root + "/" + target + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// flags, n (u16, used when flags bit 0 is clear), payload.
std::vector<uint8_t> frame(uint8_t flags, uint16_t n, const Bytes& payload) {
  std::vector<uint8_t> out = {flags, static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8)};
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// A heavy-tailed deterministic gradient, optionally with a NaN and an Inf.
std::vector<float> gradient(size_t n, uint64_t seed, bool non_finite) {
  std::vector<float> g(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : g) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double u = (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
    v = static_cast<float>((u - 0.5) / std::sqrt(u * (1.0 - u)));
  }
  if (non_finite && n > 3) {
    g[n / 3] = std::numeric_limits<float>::quiet_NaN();
    g[2 * n / 3] = -std::numeric_limits<float>::infinity();
  }
  return g;
}

// One encode (two steps, so the residual is not zero) of codec `algo`.
Bytes sparse_payload(const std::string& algo, const AlgoParams& p, size_t n, uint64_t seed,
                     bool non_finite) {
  auto codec = make_sparse_codec(algo, p);
  auto st = codec->make_state(n);
  Bytes payload;
  const auto g1 = gradient(n, seed, false);
  codec->encode(g1.data(), n, *st, payload);
  const auto g2 = gradient(n, seed + 1, non_finite);
  codec->encode(g2.data(), n, *st, payload);
  return payload;
}

void sparse_and_sbc_seeds() {
  struct S {
    const char* algo;
    ValueType v;
    IndexType i;
    size_t n;
    double density;
    bool non_finite;
    bool sbc_both_sides = false;
  };
  const S cases[] = {
      {"dgc", ValueType::kFp32, IndexType::kU32, 0, 0.01, false},
      {"dgc", ValueType::kFp32, IndexType::kU32, 1, 0.01, false},
      {"dgc", ValueType::kFp32, IndexType::kU32, 1000, 0.01, false},
      {"dgc", ValueType::kFp16, IndexType::kVarintGap, 1000, 0.02, true},
      {"dgc", ValueType::kBf16, IndexType::kU32, 300, 0.05, false},
      {"sdagc", ValueType::kFp32, IndexType::kVarintGap, 5000, 0.005, false},
      {"sdagc", ValueType::kFp16, IndexType::kU32, 200, 0.1, true},
      {"dgc", ValueType::kFp8, IndexType::kRiceGap, 5000, 0.004, false},
      {"dgc", ValueType::kFp8, IndexType::kRiceGap, 1000, 0.05, true},
      {"sdagc", ValueType::kFp8, IndexType::kVarintGap, 2000, 0.01, false},
      {"dgc", ValueType::kFp16, IndexType::kRiceGap, 0, 0.01, false},
      {"sbc", ValueType::kFp32, IndexType::kU32, 0, 0.01, false},
      {"sbc", ValueType::kFp32, IndexType::kU32, 1, 0.01, false},
      {"sbc", ValueType::kFp32, IndexType::kU32, 1000, 0.01, false},
      {"sbc", ValueType::kFp32, IndexType::kU32, 4096, 0.1, true},
      {"sbc", ValueType::kFp32, IndexType::kU32, 20000, 0.001, false},
      {"sbc", ValueType::kFp32, IndexType::kU32, 1000, 0.01, false, true},
      {"sbc", ValueType::kFp32, IndexType::kU32, 4096, 0.1, true, true},
      {"sbc", ValueType::kFp32, IndexType::kU32, 20000, 0.001, false, true},
  };
  uint64_t seed = 1;
  for (const S& c : cases) {
    AlgoParams p;
    p.density = c.density;
    p.values = c.v;
    p.indices = c.i;
    p.sbc_both_sides = c.sbc_both_sides;
    const Bytes payload = sparse_payload(c.algo, p, c.n, seed++, c.non_finite);
    const bool sbc = std::string(c.algo) == "sbc";
    std::string name = std::string(c.algo) + "_n" + std::to_string(c.n);
    if (!sbc) name += std::string("_") + value_type_name(c.v) + "_" + index_type_name(c.i);
    if (c.non_finite) name += "_nonfinite";
    if (c.sbc_both_sides) name += "_both";
    // n from the header; bit 2 also runs the secondary entry point.
    const std::vector<uint8_t> framed = frame(sbc ? 1 | 4 : 1, 0, payload);
    write(sbc ? "sbc_decode" : "sparse_decode", name, framed);
    write("decode_accumulate", name, framed);
    // The same payload with an explicit n (correct when it fits 16 bits).
    if (c.n <= 0xffff) write(sbc ? "sbc_decode" : "sparse_decode", name + "_explicit_n", frame(0, uint16_t(c.n), payload));
  }
}

void onebit_seeds() {
  struct O {
    size_t n;
    size_t block;
    ScaleMode mode;
    bool non_finite;
  };
  const O cases[] = {
      {0, 8, ScaleMode::kMeanMagnitude, false},   {1, 8, ScaleMode::kMeanMagnitude, false},
      {13, 8, ScaleMode::kSignedMeans, false},    {100, 64, ScaleMode::kMeanMagnitude, true},
      {1000, 64, ScaleMode::kSignedMeans, true},  {5000, 2048, ScaleMode::kMeanMagnitude, false},
  };
  uint64_t seed = 100;
  for (const O& c : cases) {
    const OneBitConfig cfg{c.block, c.mode};
    const auto x = gradient(c.n, seed++, c.non_finite);
    std::vector<float> err(c.n, 0.0f);
    Bytes payload;
    onebit_encode(cfg, x.data(), err.data(), c.n, payload);
    const std::string name = "onebit_n" + std::to_string(c.n) + "_b" + std::to_string(c.block) +
                             (c.mode == ScaleMode::kSignedMeans ? "_pair" : "_mean") +
                             (c.non_finite ? "_nonfinite" : "");
    write("onebit_decode", name, frame(1, 0, payload));              // overwrite
    write("onebit_decode", name + "_acc", frame(1 | 2 | 4, 0, payload));  // accumulate + both
    if (c.n == 1000) write("decode_accumulate", name, frame(1, 0, payload));  // must be rejected
  }
}

// Records [selector][length][value] for load_config (see config_fuzz.cc).
void config_seeds() {
  const auto table = config_table();
  auto selector = [&](const std::string& name) -> uint8_t {
    for (size_t i = 0; i < table.size(); ++i) {
      if (name == table[i].name) return static_cast<uint8_t>(i);
    }
    if (name == "RANK") return static_cast<uint8_t>(table.size());
    if (name == "WORLD_SIZE") return static_cast<uint8_t>(table.size() + 1);
    std::fprintf(stderr, "no configuration variable %s\n", name.c_str());
    std::exit(1);
  };
  using Settings = std::vector<std::pair<std::string, std::string>>;
  const std::pair<const char*, Settings> cases[] = {
      {"defaults", {}},
      {"dgc", {{"COMPCOLL_ALGO", "dgc"}, {"COMPCOLL_DENSITY", "0.001"}, {"COMPCOLL_MOMENTUM", "0.9"},
               {"COMPCOLL_NESTEROV", "1"}, {"COMPCOLL_CLIP", "2.5"}, {"COMPCOLL_WARMUP_STEPS", "4"},
               {"COMPCOLL_VALUE_DTYPE", "fp16"}, {"COMPCOLL_INDEX_CODING", "varint"},
               {"COMPCOLL_SELECTION", "normalized"}}},
      {"onebit", {{"COMPCOLL_ALGO", "onebit"}, {"COMPCOLL_ONEBIT_BLOCK", "4096"},
                  {"COMPCOLL_ONEBIT_SCALE", "pair"}}},
      {"csc", {{"COMPCOLL_ALGO", "csc"}, {"COMPCOLL_CSC_CHUNK", "1024"}, {"COMPCOLL_CSC_FRACTION", "0.05"},
               {"COMPCOLL_MIN_ELEMS", "0"}}},
      {"auto", {{"COMPCOLL_ALGO", "auto"}, {"COMPCOLL_AUTO_ALGO", "sbc"}, {"COMPCOLL_SAMPLE_FRACTION", "0.02"}}},
      {"ranks", {{"COMPCOLL_RANK", "3"}, {"COMPCOLL_WORLD_SIZE", "8"}, {"COMPCOLL_TIMEOUT_MS", "30000"},
                 {"COMPCOLL_DEBUG", "INFO"}}},
      {"torchrun", {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"COMPCOLL_TRANSPORT", "tcp"},
                    {"COMPCOLL_IFACE", "lo"}}},
      {"rendezvous", {{"COMPCOLL_RENDEZVOUS", "file:///tmp/compcoll-rdv"}, {"COMPCOLL_HOSTNAME", "127.0.0.1"},
                      {"COMPCOLL_STATS_FILE", "/tmp/stats.{rank}.json"}}},
      {"redis", {{"COMPCOLL_RENDEZVOUS", "redis://127.0.0.1:6379"}, {"COMPCOLL_ALGO", "sdagc"}}},
  };
  for (const auto& [name, settings] : cases) {
    std::vector<uint8_t> bytes;
    for (const auto& [var, value] : settings) {
      bytes.push_back(selector(var));
      bytes.push_back(static_cast<uint8_t>(value.size()));
      bytes.insert(bytes.end(), value.begin(), value.end());
    }
    write("config", name, bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  make_dir(g_root);
  sparse_and_sbc_seeds();
  onebit_seeds();
  config_seeds();
  return 0;
}
