#include "plugin/nccl_interposer/buffer_keys.h"

namespace compcoll::interposer {

std::string BufferKeys::key(const void* recv, size_t count, DType dtype) {
  const Buffer b{reinterpret_cast<uintptr_t>(recv), count, dtype};
  auto it = index_.find(b);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  } else {
    if (index_.size() >= kMaxBuffers) {
      index_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(b);
    it = index_.emplace(b, Slot{next_ordinal_++, lru_.begin()}).first;
  }
  return "nccl:b" + std::to_string(it->second.ordinal) + "/" + dtype_name(dtype);
}

}  // namespace compcoll::interposer
