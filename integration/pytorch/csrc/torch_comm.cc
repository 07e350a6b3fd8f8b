#include "integration/pytorch/csrc/torch_comm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>

#include "collectives/dense.h"
#include "compcoll/error.h"

namespace compcoll::torch_integration {
namespace {

at::Tensor int64_tensor(int64_t n) { return at::empty({n}, at::TensorOptions().dtype(at::kLong)); }
at::Tensor byte_tensor(int64_t n) { return at::empty({n}, at::TensorOptions().dtype(at::kByte)); }

c10::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat64: return at::kDouble;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kUInt8: return at::kByte;
    case DType::kInt8: return at::kChar;
  }
  CC_THROW(kInternal, "unknown dtype ", static_cast<int>(d));
}

c10d::ReduceOp to_torch_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::kProd: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case ReduceOp::kAvg: break;
  }
  CC_THROW(kInvalidArgument, "TorchComm::allreduce does not take AVG (the collectives sum and divide)");
}

// torch's errors carry the C++ stack that raised them, which is not the
// user's to read: the message alone.
std::string without_stack(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace

bool to_compcoll_dtype(c10::ScalarType t, DType* out) {
  switch (t) {
    case at::kFloat: *out = DType::kFloat32; return true;
    case at::kHalf: *out = DType::kFloat16; return true;
    case at::kBFloat16: *out = DType::kBFloat16; return true;
    case at::kDouble: *out = DType::kFloat64; return true;
    case at::kInt: *out = DType::kInt32; return true;
    case at::kLong: *out = DType::kInt64; return true;
    case at::kByte: *out = DType::kUInt8; return true;
    case at::kChar: *out = DType::kInt8; return true;
    default: return false;
  }
}

uint64_t tree_broadcast_bytes(int rank, int size, int root, uint64_t bytes) {
  // Binomial tree on ranks relative to root: relative rank r forwards to
  // r + 2^k for every 2^k above r's highest set bit with r + 2^k < size.
  const int r = (rank - root + size) % size;
  uint64_t children = 0;
  int k = 1;
  while (k <= r) k <<= 1;
  for (; r + k < size; k <<= 1) ++children;
  return children * bytes;
}

TorchComm::TorchComm(c10::intrusive_ptr<c10d::Backend> inner,
                     std::shared_ptr<const GroupTimeout> timeout,
                     std::optional<c10::Device> staging)
    : inner_(std::move(inner)), timeout_(std::move(timeout)), staging_(staging) {
  CC_CHECK(inner_, kInvalidArgument, "TorchComm needs an inner backend");
  CC_CHECK(timeout_, kInvalidArgument, "TorchComm needs the group's timeout");
  rank_ = inner_->getRank();
  size_ = inner_->getSize();
  inner_name_ = inner_->getBackendName();
}

at::Tensor TorchComm::to_inner(const at::Tensor& host) const {
  if (!staging_) return host;
  at::Tensor staged = at::empty(host.sizes(), host.options().device(*staging_));
  staged.copy_(host);  // on the current stream; the inner backend orders itself after it
  return staged;
}

at::Tensor TorchComm::inner_empty(int64_t n, c10::ScalarType dtype) const {
  auto options = at::TensorOptions().dtype(dtype);
  return at::empty({n}, staging_ ? options.device(*staging_) : options);
}

at::Tensor TorchComm::to_host(const at::Tensor& t) const {
  if (!staging_) return t;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
  host.copy_(t);  // non_blocking=false: complete on return
  return host;
}

void TorchComm::check_usable(const char* what) const {
  CC_CHECK(broken_.empty(), kTransport, "rank ", rank_, "/", size_, ": ", what,
           " on a torch communicator that failed earlier; it must be rebuilt (first error: ",
           broken_, ")");
}

void TorchComm::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  const std::chrono::milliseconds timeout = timeout_->get();
  try {
    work->wait(timeout);
  } catch (const std::exception& e) {
    const std::string why = without_stack(e);
    broken_ = std::string(what) + ": " + why;
    CC_THROW(kTransport, "rank ", rank_, "/", size_, ": ", what,
             " through the inner ", inner_name_, " process group failed (timeout ",
             timeout.count(), " ms): ", why);
  }
}

template <typename Issue>
void TorchComm::run(const char* what, Issue&& issue) {
  check_usable(what);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    const std::string why = without_stack(e);
    broken_ = std::string(what) + ": " + why;
    CC_THROW(kTransport, "rank ", rank_, "/", size_, ": ", what,
             " could not be issued on the inner ", inner_name_, " process group: ", why);
  }
  wait(work, what);
}

void TorchComm::refuse_part(int peer, int64_t announced, size_t max_part) {
  if (announced >= 0 && static_cast<uint64_t>(announced) <= max_part) return;
  const std::string msg =
      announced < 0 ? detail::concat("rank ", peer, " announced a payload of ", announced, " bytes")
                    : oversized_part_message(peer, static_cast<uint64_t>(announced), max_part);
  broken_ = msg;
  CC_THROW(kTransport, "rank ", rank_, "/", size_, ": ", msg);
}

Gathered TorchComm::allgatherv(std::span<const uint8_t> send, size_t max_part) {
  check_own_part(send.size(), max_part, "allgatherv");
  const int P = size_;
  at::Tensor mine = int64_tensor(1);
  mine.data_ptr<int64_t>()[0] = static_cast<int64_t>(send.size());
  at::Tensor mine_in = to_inner(mine);
  at::Tensor sizes_in = inner_empty(P, at::kLong);
  // Every inner operation carries the timeout: the group's, or inside an
  // operation with its own, that one (group_timeout.h).
  c10d::AllgatherOptions gather_opts;
  gather_opts.timeout = timeout_->get();
  run("allgatherv (sizes)",
      [&] { return inner_->_allgather_base(sizes_in, mine_in, gather_opts); });
  bytes_sent_ += uint64_t(P - 1) * sizeof(int64_t);
  const at::Tensor sizes = to_host(sizes_in);

  const int64_t* sz = sizes.data_ptr<int64_t>();
  Gathered out;
  out.offsets.assign(P + 1, 0);
  int64_t padded = 0;
  for (int r = 0; r < P; ++r) {
    refuse_part(r, sz[r], max_part);
    if (r == rank_) {
      CC_CHECK_EQ(sz[r], int64_t(send.size()), kInternal,
                  "allgatherv size exchange returned another size for this rank");
    }
    padded = std::max(padded, sz[r]);
    out.offsets[r + 1] = out.offsets[r] + static_cast<size_t>(sz[r]);
  }
  if (padded == 0) return out;  // every rank knows every payload is empty

  at::Tensor in = byte_tensor(padded);
  uint8_t* in_p = in.data_ptr<uint8_t>();
  if (!send.empty()) std::memcpy(in_p, send.data(), send.size());
  std::memset(in_p + send.size(), 0, static_cast<size_t>(padded) - send.size());
  at::Tensor in_inner = to_inner(in);
  at::Tensor all_inner = inner_empty(padded * P, at::kByte);
  run("allgatherv (payloads)",
      [&] { return inner_->_allgather_base(all_inner, in_inner, gather_opts); });
  bytes_sent_ += uint64_t(P - 1) * uint64_t(padded);
  const at::Tensor all = to_host(all_inner);

  out.data.resize(out.offsets[P]);
  const uint8_t* all_p = all.data_ptr<uint8_t>();
  for (int r = 0; r < P; ++r) {
    if (sz[r] > 0) std::memcpy(out.data.data() + out.offsets[r], all_p + r * padded, sz[r]);
  }
  return out;
}

std::vector<Bytes> TorchComm::alltoallv(const std::vector<Bytes>& send, size_t max_part) {
  const int P = size_;
  CC_CHECK_EQ(static_cast<int>(send.size()), P, kInvalidArgument,
              "alltoallv needs one payload per rank");
  for (const Bytes& b : send) check_own_part(b.size(), max_part, "alltoallv");
  check_usable("alltoallv");
  at::Tensor send_sizes = int64_tensor(P);
  int64_t* ss = send_sizes.data_ptr<int64_t>();
  for (int j = 0; j < P; ++j) ss[j] = static_cast<int64_t>(send[j].size());
  at::Tensor send_sizes_in = to_inner(send_sizes);
  at::Tensor recv_sizes_in = inner_empty(P, at::kLong);
  std::vector<int64_t> equal_out, equal_in;  // empty split lists: one element per rank
  c10d::AllToAllOptions a2a_opts;
  a2a_opts.timeout = timeout_->get();
  run("alltoallv (sizes)", [&] {
    return inner_->alltoall_base(recv_sizes_in, send_sizes_in, equal_out, equal_in, a2a_opts);
  });
  bytes_sent_ += uint64_t(P - 1) * sizeof(int64_t);
  const at::Tensor recv_sizes = to_host(recv_sizes_in);

  const int64_t* rs = recv_sizes.data_ptr<int64_t>();
  std::vector<int64_t> in_splits(ss, ss + P), out_splits(rs, rs + P);
  for (int j = 0; j < P; ++j) refuse_part(j, rs[j], max_part);
  const int64_t send_total = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  at::Tensor in = byte_tensor(send_total);
  uint8_t* in_p = in.data_ptr<uint8_t>();
  for (int j = 0; j < P; ++j) {
    if (!send[j].empty()) std::memcpy(in_p, send[j].data(), send[j].size());
    in_p += send[j].size();
  }
  // The inner backend may take (move from) the split vectors: hand it copies.
  std::vector<int64_t> out_arg = out_splits, in_arg = in_splits;
  at::Tensor in_inner = to_inner(in);
  at::Tensor out_inner = inner_empty(recv_total, at::kByte);
  run("alltoallv (payloads)",
      [&] { return inner_->alltoall_base(out_inner, in_inner, out_arg, in_arg, a2a_opts); });
  const at::Tensor out = to_host(out_inner);
  for (int j = 0; j < P; ++j) {
    if (j != rank_) bytes_sent_ += send[j].size();
  }

  std::vector<Bytes> recv(P);
  const uint8_t* out_p = out.data_ptr<uint8_t>();
  for (int j = 0; j < P; ++j) {
    recv[j].assign(out_p, out_p + out_splits[j]);
    out_p += out_splits[j];
  }
  return recv;
}

void TorchComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const c10d::ReduceOp top = to_torch_op(op);  // argument errors before any traffic
  check_usable("allreduce");
  if (count == 0) return;  // collective: every rank has the same count
  const at::Tensor host = at::from_blob(buf, {static_cast<int64_t>(count)},
                                        at::TensorOptions().dtype(to_scalar_type(dtype)));
  std::vector<at::Tensor> t{to_inner(host)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = top;
  opts.timeout = timeout_->get();
  run("allreduce", [&] { return inner_->allreduce(t, opts); });
  if (staging_) host.copy_(t[0]);
  bytes_sent_ += ring_allreduce_bytes(count * dtype_size(dtype), size_);
}

void TorchComm::broadcast(void* buf, size_t bytes, int root) {
  CC_CHECK(root >= 0 && root < size_, kInvalidArgument, "broadcast root ", root,
           " is not a rank of ", size_);
  check_usable("broadcast");
  if (bytes == 0) return;
  const at::Tensor host = at::from_blob(buf, {static_cast<int64_t>(bytes)},
                                        at::TensorOptions().dtype(at::kByte));
  std::vector<at::Tensor> t{to_inner(host)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_->get();
  run("broadcast", [&] { return inner_->broadcast(t, opts); });
  if (staging_) host.copy_(t[0]);
  bytes_sent_ += tree_broadcast_bytes(rank_, size_, root, bytes);
}

void TorchComm::barrier() {
  if (staging_) {
    // A one-element allreduce on the staging device: an inner barrier would
    // pick its own device (NCCL guesses one when none is bound).
    std::vector<at::Tensor> t{inner_empty(1, at::kInt).zero_()};
    c10d::AllreduceOptions opts;
    opts.timeout = timeout_->get();
    run("barrier", [&] { return inner_->allreduce(t, opts); });
    return;
  }
  c10d::BarrierOptions opts;
  opts.timeout = timeout_->get();
  run("barrier", [&] { return inner_->barrier(opts); });
}

}  // namespace compcoll::torch_integration
