// compcoll's C++ API: RAII over the C API, errors as compcoll::Exception.
// Header-only, so C++ users depend on the stable C ABI of libcompcoll only.
// C++14 or later (the CMake package's target requires it of its users);
// compcoll.h alone is C.
#pragma once

#if defined(__cplusplus) && __cplusplus < 201402L && !defined(_MSVC_LANG)
#error "compcoll.hpp needs C++14 or later (-std=c++14); from older C++, include compcoll/compcoll.h"
#endif

#include <stdexcept>
#include <string>
#include <utility>

#include "compcoll/compcoll.h"

namespace compcoll {

class Exception : public std::runtime_error {
 public:
  Exception(compcoll_status_t status, const std::string& what)
      : std::runtime_error(what), status_(status) {}
  compcoll_status_t status() const { return status_; }

 private:
  compcoll_status_t status_;
};

inline void check(compcoll_status_t s) {
  if (s != COMPCOLL_SUCCESS) {
    throw Exception(s, std::string(compcoll_status_string(s)) + ": " + compcoll_last_error());
  }
}

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr compcoll_dtype_t value = COMPCOLL_FLOAT32; };
template <> struct DTypeOf<double> { static constexpr compcoll_dtype_t value = COMPCOLL_FLOAT64; };
template <> struct DTypeOf<int32_t> { static constexpr compcoll_dtype_t value = COMPCOLL_INT32; };
template <> struct DTypeOf<int64_t> { static constexpr compcoll_dtype_t value = COMPCOLL_INT64; };

class Comm {
 public:
  // From the COMPCOLL_* environment.
  Comm() { check(compcoll_comm_create_from_env(&c_)); }
  Comm(const std::string& rendezvous, int rank, int world_size) {
    check(compcoll_comm_create(rendezvous.c_str(), rank, world_size, &c_));
  }
  ~Comm() { compcoll_comm_destroy(c_); }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}

  template <typename T>
  void allreduce(T* buf, size_t count, compcoll_op_t op = COMPCOLL_SUM, const char* key = nullptr) {
    check(compcoll_allreduce(c_, buf, count, DTypeOf<T>::value, op, key));
  }
  void allreduce(void* buf, size_t count, compcoll_dtype_t dtype, compcoll_op_t op,
                 const char* key = nullptr) {
    check(compcoll_allreduce(c_, buf, count, dtype, op, key));
  }
  int rank() const {
    int r = -1;
    check(compcoll_comm_rank(c_, &r));
    return r;
  }
  int size() const {
    int s = 0;
    check(compcoll_comm_size(c_, &s));
    return s;
  }
  compcoll_stats_t stats() const {
    compcoll_stats_t s{};
    check(compcoll_get_stats(c_, &s));
    return s;
  }
  compcoll_steady_stats_t steady_stats() const {
    compcoll_steady_stats_t s{};
    check(compcoll_get_steady_stats(c_, &s));
    return s;
  }
  // Mixed precision (compcoll.h): the loss scale changed by factor; a loss
  // scaler is (or is no longer) in charge.
  size_t rescale_state(double factor) {
    size_t n = 0;
    check(compcoll_rescale_state(c_, factor, &n));
    return n;
  }
  void set_loss_scaled(bool on) { check(compcoll_set_loss_scaled(c_, on ? 1 : 0)); }
  compcoll_comm_t* get() { return c_; }

 private:
  compcoll_comm_t* c_ = nullptr;
};

}  // namespace compcoll
