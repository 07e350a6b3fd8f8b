#include "plugin/state_file.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "compcoll/error.h"
#include "plugin/writable_dir.h"

namespace compcoll {
namespace {

constexpr char kMagic[8] = {'C', 'C', 'S', 'T', 'A', 'T', 'E', '1'};

uint64_t fnv1a(std::span<const uint8_t> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    if (n == 0) return;  // p may be null for an empty vector
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void put_string(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    put_bytes(s.data(), s.size());
  }
  Bytes out;
};

// Reads from a bounded span; every read checks what is left first.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string(const char* what) {
    const uint32_t n = get<uint32_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // n elements of T; refuses counts the remaining bytes cannot hold before
  // allocating anything.
  template <typename T>
  void get_array(std::vector<T>& dst, uint64_t n, const char* what) {
    CC_CHECK(n <= left() / sizeof(T), kInvalidArgument, "compcoll state file: ", what, " claims ",
             n, " elements but only ", left(), " bytes are left (truncated or corrupted)");
    dst.resize(n);
    if (n) std::memcpy(dst.data(), b_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  void need(size_t n, const char* what) {
    CC_CHECK(n <= left(), kInvalidArgument, "compcoll state file: truncated in ", what, " (",
             n, " bytes needed, ", left(), " left)");
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace

Bytes serialize_state_file(const StateFile& file) {
  Writer w;
  w.put_bytes(kMagic, sizeof(kMagic));
  w.put(kStateFileVersion);
  w.put(file.config_hash);
  w.put_string(file.description);
  w.put(static_cast<int32_t>(file.rank));
  w.put(static_cast<int32_t>(file.world_size));
  w.put(file.clock);
  w.put(file.optimizer_momentum.m);
  w.put(static_cast<uint8_t>(file.optimizer_momentum.moved ? 1 : 0));
  w.put(static_cast<uint32_t>(file.entries.size()));
  for (const StateFileEntry& e : file.entries) {
    const CodecState& s = *e.state;
    w.put_string(e.key);
    w.put(e.idle);
    w.put(s.steps);
    w.put(s.lambda);
    w.put(static_cast<uint64_t>(s.v.size()));
    w.put(static_cast<uint64_t>(s.u.size()));
    w.put(static_cast<uint64_t>(s.regions.size()));
    w.put(static_cast<uint64_t>(s.handed.size()));
    w.put_bytes(s.v.data(), s.v.size() * sizeof(float));
    w.put_bytes(s.u.data(), s.u.size() * sizeof(float));
    for (size_t r : s.regions) w.put(static_cast<uint64_t>(r));
    w.put_bytes(s.handed.data(), s.handed.size() * sizeof(float));
    w.put(static_cast<uint64_t>(s.second_moment.size()));
    w.put_bytes(s.second_moment.data(), s.second_moment.size() * sizeof(float));
  }
  w.put(fnv1a(w.out));
  return std::move(w.out);
}

StateFile parse_state_file(std::span<const uint8_t> bytes) {
  CC_CHECK(bytes.size() >= sizeof(kMagic) + sizeof(uint64_t), kInvalidArgument,
           "compcoll state file: ", bytes.size(), " bytes is too short to be one");
  CC_CHECK(std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0, kInvalidArgument,
           "compcoll state file: bad magic (not a compcoll state file)");
  const auto body = bytes.first(bytes.size() - sizeof(uint64_t));
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body.size(), sizeof(stored));
  CC_CHECK(stored == fnv1a(body), kInvalidArgument,
           "compcoll state file: checksum mismatch (corrupted or truncated)");

  Reader r(body.subspan(sizeof(kMagic)));
  const auto version = r.get<uint32_t>("the version");
  CC_CHECK(version >= kOldestStateFileVersion && version <= kStateFileVersion, kInvalidArgument,
           "compcoll state file: version ", version, ", this build reads versions ",
           kOldestStateFileVersion, " to ", kStateFileVersion);
  StateFile f;
  f.config_hash = r.get<uint64_t>("the configuration hash");
  f.description = r.get_string("the configuration description");
  f.rank = r.get<int32_t>("the rank");
  f.world_size = r.get<int32_t>("the world size");
  CC_CHECK(f.world_size >= 1 && f.rank >= 0 && f.rank < f.world_size, kInvalidArgument,
           "compcoll state file: rank ", f.rank, " of world size ", f.world_size, " is impossible");
  f.clock = r.get<uint64_t>("the clock");
  if (version >= 3) {
    f.optimizer_momentum.m = r.get<float>("the optimizer momentum");
    CC_CHECK(f.optimizer_momentum.m >= 0.0f && f.optimizer_momentum.m < 1.0f, kInvalidArgument,
             "compcoll state file: optimizer momentum ", f.optimizer_momentum.m,
             " is outside [0, 1)");
  }
  if (version >= 4) {  // version 3 knew the SGD hand-over only
    const auto moved = r.get<uint8_t>("the optimizer momentum's kind");
    CC_CHECK(moved <= 1, kInvalidArgument, "compcoll state file: optimizer momentum kind ",
             int(moved), " is neither 0 (handed over) nor 1 (moved)");
    f.optimizer_momentum.moved = moved == 1;
  }
  const auto n = r.get<uint32_t>("the entry count");
  for (uint32_t i = 0; i < n; ++i) {
    StateFileEntry e;
    e.key = r.get_string("an entry's key");
    e.idle = r.get<uint64_t>("an entry's age");
    const auto steps = r.get<uint64_t>("an entry's step count");
    const auto lambda = r.get<float>("an entry's lambda");
    const auto nv = r.get<uint64_t>("an entry's residual length");
    const auto nu = r.get<uint64_t>("an entry's momentum length");
    const auto nr = r.get<uint64_t>("an entry's region count");
    const auto nh = r.get<uint64_t>("an entry's hand-over length");
    e.owned = std::make_unique<CodecState>(0);
    r.get_array(e.owned->v, nv, "a residual");
    r.get_array(e.owned->u, nu, "a momentum");
    std::vector<uint64_t> regions;
    r.get_array(regions, nr, "the regions");
    e.owned->regions.assign(regions.begin(), regions.end());
    r.get_array(e.owned->handed, nh, "a momentum hand-over mirror");
    if (version >= 5) {
      const auto ns = r.get<uint64_t>("an entry's second-moment length");
      r.get_array(e.owned->second_moment, ns, "a second moment");
    }
    e.owned->steps = steps;
    e.owned->lambda = lambda;
    e.state = e.owned.get();
    f.entries.push_back(std::move(e));
  }
  CC_CHECK(r.left() == 0, kInvalidArgument, "compcoll state file: ", r.left(),
           " unexpected bytes after the last entry");
  return f;
}

Bytes read_binary_file(const std::string& path) {
  std::error_code ec;
  CC_CHECK(!std::filesystem::is_directory(path, ec), kInvalidArgument, "compcoll state file ", path,
           " is a directory");
  std::ifstream in(path, std::ios::binary);
  CC_CHECK(in.good(), kInvalidArgument, "cannot open compcoll state file ", path);
  Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CC_CHECK(!in.bad(), kInvalidArgument, "cannot read compcoll state file ", path);
  return b;
}

bool write_binary_file_atomically(const std::string& path, std::span<const uint8_t> bytes) {
  // A name of this writer's own: ranks that share a path (a stats file
  // without {rank}) or communicators of one process must not write into
  // each other's temporary file (one would rename the other's away).
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(writes.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string state_dir_problem(const std::string& dir) {
  const DirCheck check = prepare_writable_dir(dir);
  switch (check.problem) {
    case DirCheck::Problem::kNone: return {};
    case DirCheck::Problem::kCannotCreate: return "cannot create the directory: " + check.reason;
    case DirCheck::Problem::kNotADirectory: return "exists and is not a directory";
    case DirCheck::Problem::kNotWritable: return "the directory is not writable: " + check.reason;
  }
  return {};
}

}  // namespace compcoll
