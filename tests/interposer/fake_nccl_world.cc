#include "tests/interposer/fake_nccl_world.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "compression/half.h"

namespace fakenccl {

Comm* new_comm() {
  static std::mutex mu;
  // Never destroyed: rank threads may still hold handles while the process
  // exits.
  static auto* registry = new std::vector<std::unique_ptr<Comm>>();
  std::lock_guard<std::mutex> lk(mu);
  registry->push_back(std::make_unique<Comm>());
  return registry->back().get();
}
namespace {

template <typename Acc, typename Load, typename Store>
void reduce(const std::vector<const void*>& in, void* out, size_t count, ncclRedOp_t op,
            Load load, Store store) {
  const int R = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    Acc acc = load(in[0], i);  // rank order, like a reference sum
    for (int r = 1; r < R; ++r) {
      const Acc x = load(in[r], i);
      switch (op) {
        case ncclProd: acc = acc * x; break;
        case ncclMax: acc = acc < x ? x : acc; break;
        case ncclMin: acc = x < acc ? x : acc; break;
        default: acc = acc + x; break;  // sum, avg
      }
    }
    if (op == ncclAvg) acc = acc / static_cast<Acc>(R);
    store(out, i, acc);
  }
}

template <typename T, typename Acc>
void reduce_plain(const std::vector<const void*>& in, void* out, size_t count, ncclRedOp_t op) {
  reduce<Acc>(in, out, count, op,
              [](const void* p, size_t i) { return static_cast<Acc>(static_cast<const T*>(p)[i]); },
              [](void* p, size_t i, Acc v) { static_cast<T*>(p)[i] = static_cast<T>(v); });
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(const std::vector<const void*>& in, void* out, size_t count, ncclRedOp_t op) {
  reduce<float>(in, out, count, op,
                [](const void* p, size_t i) { return ToFloat(static_cast<const uint16_t*>(p)[i]); },
                [](void* p, size_t i, float v) { static_cast<uint16_t*>(p)[i] = FromFloat(v); });
}

void reduce_any(ncclDataType_t t, const std::vector<const void*>& in, void* out, size_t count,
                ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: return reduce_plain<int8_t, int64_t>(in, out, count, op);
    case ncclUint8: return reduce_plain<uint8_t, uint64_t>(in, out, count, op);
    case ncclInt32: return reduce_plain<int32_t, int64_t>(in, out, count, op);
    case ncclUint32: return reduce_plain<uint32_t, uint64_t>(in, out, count, op);
    case ncclInt64: return reduce_plain<int64_t, int64_t>(in, out, count, op);
    case ncclUint64: return reduce_plain<uint64_t, uint64_t>(in, out, count, op);
    case ncclFloat16:
      return reduce_half<compcoll::half_to_float, compcoll::float_to_half>(in, out, count, op);
    case ncclBfloat16:
      return reduce_half<compcoll::bf16_to_float, compcoll::float_to_bf16>(in, out, count, op);
    case ncclFloat64: return reduce_plain<double, double>(in, out, count, op);
    default: return reduce_plain<float, float>(in, out, count, op);
  }
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "allreduce";
    case Kind::kAllGather: return "allgather";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kReduceScatter: return "reducescatter";
    case Kind::kSplit: return "split";
  }
  return "?";
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 1;
  }
}

int next_comm_id() {
  static std::atomic<int> id{0};
  return id++;
}

void World::arrive(uint64_t seq, int rank, const Part& part) {
  std::lock_guard<std::mutex> lk(mu_);
  Op& op = ops_[seq];
  if (op.parts.empty()) op.parts.resize(size_);
  op.parts[rank] = part;
  if (++op.arrived == size_) {
    if (aborted_) op.result = ncclRemoteError;
    else execute(op);
    op.done = true;
  }
}

bool World::done(uint64_t seq, ncclResult_t* error) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = ops_.find(seq);
  if (aborted_ && (it == ops_.end() || !it->second.done)) {
    *error = ncclRemoteError;
    return true;
  }
  if (it == ops_.end() || !it->second.done) return false;
  *error = it->second.result;
  return true;
}

Comm* World::split_child(uint64_t seq, int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = ops_.find(seq);
  return it == ops_.end() || it->second.children.empty() ? nullptr : it->second.children[rank];
}

void World::post(int src, int dst, const void* data, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  mail_[{src, dst}].emplace_back(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
}

bool World::try_take(int src, int dst, void* data, size_t bytes, ncclResult_t* error) {
  std::lock_guard<std::mutex> lk(mu_);
  *error = ncclSuccess;
  auto& q = mail_[{src, dst}];
  if (q.empty()) {
    if (aborted_) *error = ncclRemoteError;
    return aborted_;
  }
  if (q.front().size() != bytes) {
    std::fprintf(stderr, "fake nccl: world %d: rank %d receives %zu bytes from rank %d, which sent %zu\n",
                 id_, dst, bytes, src, q.front().size());
    *error = ncclInvalidUsage;
  } else {
    std::memcpy(data, q.front().data(), bytes);
  }
  q.pop_front();
  return true;
}

void World::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = true;
}

bool World::aborted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return aborted_;
}

void World::execute(Op& op) {
  const Part& p0 = op.parts[0];
  for (int r = 1; r < size_; ++r) {
    const Part& p = op.parts[r];
    if (p.kind != p0.kind || (p0.kind != Kind::kSplit && (p.count != p0.count || p.type != p0.type ||
                                                          p.op != p0.op || p.root != p0.root))) {
      std::fprintf(stderr, "fake nccl: world %d: rank 0 called %s(count %zu) but rank %d called %s(count %zu)\n",
                   id_, kind_name(p0.kind), p0.count, r, kind_name(p.kind), p.count);
      op.result = ncclInvalidUsage;
      return;
    }
  }
  const size_t bytes = p0.count * type_size(p0.type);
  std::vector<const void*> sends(size_);
  for (int r = 0; r < size_; ++r) sends[r] = op.parts[r].send;
  switch (p0.kind) {
    case Kind::kAllReduce: {
      std::vector<char> tmp(bytes);
      reduce_any(p0.type, sends, tmp.data(), p0.count, p0.op);
      for (const Part& p : op.parts) std::memcpy(p.recv, tmp.data(), bytes);
      return;
    }
    case Kind::kReduceScatter: {
      std::vector<char> tmp(bytes * size_);
      reduce_any(p0.type, sends, tmp.data(), p0.count * size_, p0.op);
      for (int r = 0; r < size_; ++r) std::memcpy(op.parts[r].recv, tmp.data() + r * bytes, bytes);
      return;
    }
    case Kind::kAllGather: {
      std::vector<char> tmp(bytes * size_);  // sends may alias receives (in place)
      for (int r = 0; r < size_; ++r) std::memcpy(tmp.data() + r * bytes, sends[r], bytes);
      for (const Part& p : op.parts) std::memcpy(p.recv, tmp.data(), tmp.size());
      return;
    }
    case Kind::kBroadcast: {
      std::vector<char> tmp(static_cast<const char*>(sends[p0.root]),
                            static_cast<const char*>(sends[p0.root]) + bytes);
      for (const Part& p : op.parts) std::memcpy(p.recv, tmp.data(), bytes);
      return;
    }
    case Kind::kSplit: {
      op.children.assign(size_, nullptr);
      std::map<int, std::vector<std::pair<int, int>>> groups;  // color -> (key, old rank)
      for (int r = 0; r < size_; ++r) {
        if (op.parts[r].color != NCCL_SPLIT_NOCOLOR) groups[op.parts[r].color].push_back({op.parts[r].key, r});
      }
      for (auto& [color, members] : groups) {
        std::sort(members.begin(), members.end());
        auto w = std::make_shared<World>(static_cast<int>(members.size()), next_comm_id());
        for (size_t i = 0; i < members.size(); ++i) {
          Comm* c = new_comm();
          c->world = w;
          c->rank = static_cast<int>(i);
          c->id = w->id();
          op.children[members[i].second] = c;
        }
      }
      return;
    }
  }
}

}  // namespace fakenccl
