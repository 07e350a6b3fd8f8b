#include "compression/golomb.h"

#include <cmath>
#include <cstring>

#include "compression/payload.h"

namespace compcoll {
namespace {

// Writes LSB-first bits into a buffer sized for the whole stream up front,
// 32 bits at a time: a byte-by-byte push_back cost more than the coding
// (about 6 ns an entry at density 0.001, where a code is about 12 bits).
class BitWriter {
 public:
  // Appends to out; max_bits bounds what will be put.
  BitWriter(Bytes& out, uint64_t max_bits) : out_(out), start_(out.size()) {
    // Room for the bound, plus the whole word the last flush may store.
    out_.resize(start_ + size_t(max_bits / 8) + 8);
    p_ = out_.data() + start_;
  }

  void put(uint64_t value, int nbits) {  // nbits <= 32, value < 2^nbits
    acc_ |= value << fill_;
    fill_ += nbits;
    bits_ += size_t(nbits);
    if (fill_ >= 32) {
      store_le<uint32_t>(p_, static_cast<uint32_t>(acc_));
      p_ += 4;
      acc_ >>= 32;
      fill_ -= 32;
    }
  }

  void put_ones(uint64_t count) {
    while (count >= 32) {
      put(0xffffffffu, 32);
      count -= 32;
    }
    put((uint64_t{1} << count) - 1, static_cast<int>(count));
  }

  // Flushes the last partial word and trims out to the bits written.
  size_t finish() {
    store_le<uint32_t>(p_, static_cast<uint32_t>(acc_));
    out_.resize(start_ + (bits_ + 7) / 8);
    return bits_;
  }

 private:
  Bytes& out_;
  size_t start_;
  uint8_t* p_;
  uint64_t acc_ = 0;
  int fill_ = 0;
  size_t bits_ = 0;
};

// Reads LSB-first bits a word at a time: a Rice code's unary part is the
// run of ones, counted with one ctz per 57 bits instead of a test per bit.
class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> bytes) : bytes_(bytes), total_(bytes.size() * 8) {}

  // The length of the run of ones from the current position, which it
  // skips, and the stop bit after it. Throws if the stream ends first.
  uint64_t unary() {
    uint64_t run = 0;
    for (;;) {
      CC_PAYLOAD_CHECK(pos_ < total_, "Golomb-Rice stream is truncated at bit ", pos_);
      const uint64_t ones = static_cast<uint64_t>(__builtin_ctzll(~peek()));  // peek has a 0 at bit 57+
      if (ones < kPeekBits) {
        CC_PAYLOAD_CHECK(pos_ + ones < total_, "Golomb-Rice stream is truncated at bit ", total_);
        pos_ += ones + 1;
        return run + ones;
      }
      run += kPeekBits;
      pos_ += kPeekBits;
    }
  }

  uint64_t bits(int nbits) {  // nbits <= 32
    CC_PAYLOAD_CHECK(pos_ + size_t(nbits) <= total_, "Golomb-Rice stream is truncated at bit ", pos_);
    const uint64_t v = nbits == 0 ? 0 : peek() & ((uint64_t{1} << nbits) - 1);
    pos_ += size_t(nbits);
    return v;
  }

  size_t remaining() const { return total_ - pos_; }

 private:
  // At least 57 bits from pos_ (zeros past the end), bit 57 and up cleared.
  static constexpr uint64_t kPeekBits = 57;
  uint64_t peek() const {
    const size_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte + 8 <= bytes_.size()) {
      std::memcpy(&w, bytes_.data() + byte, 8);
    } else if (byte < bytes_.size()) {
      std::memcpy(&w, bytes_.data() + byte, bytes_.size() - byte);
    }
    return (w >> (pos_ & 7)) & ((uint64_t{1} << kPeekBits) - 1);
  }

  std::span<const uint8_t> bytes_;
  size_t total_;
  size_t pos_ = 0;
};

}  // namespace

int golomb_rice_parameter(double density) {
  if (!(density > 0.0) || density >= 1.0) return 0;
  const double phi = (1.0 + std::sqrt(5.0)) / 2.0;
  const double ratio = std::log(phi - 1.0) / std::log1p(-density);
  const int b = 1 + static_cast<int>(std::floor(std::log2(ratio)));
  return b < 0 ? 0 : (b > 31 ? 31 : b);
}

size_t rice_encode_positions(std::span<const uint32_t> idx, int b, Bytes& out) {
  // Every code is b + 1 bits plus its gap >> b in ones, and the gaps sum to
  // at most the last position + 1.
  const uint64_t span = idx.empty() ? 0 : uint64_t{idx.back()} + 1;
  BitWriter w(out, idx.size() * (uint64_t(b) + 1) + (span >> b));
  uint64_t next = 0;  // smallest position the next entry may have
  const uint64_t low_mask = (uint64_t{1} << b) - 1;
  for (const uint32_t p : idx) {
    // Also what keeps the writer inside the bound it was sized for.
    CC_CHECK(p >= next, kInternal, "Golomb-Rice positions are not strictly increasing at ", p);
    const uint64_t gap = p - next;
    w.put_ones(gap >> b);
    w.put(0, 1);
    w.put(gap & low_mask, b);
    next = uint64_t{p} + 1;
  }
  return w.finish();
}

std::vector<uint32_t> rice_decode_positions(std::span<const uint8_t> bits, uint64_t k, int b,
                                            uint64_t n) {
  CC_PAYLOAD_CHECK(b >= 0 && b <= 31, "Golomb-Rice parameter ", b, " outside [0, 31]");
  // Every code takes at least b + 1 bits: reject impossible counts before
  // allocating anything for them.
  CC_PAYLOAD_CHECK(k <= n && k * (uint64_t(b) + 1) <= bits.size() * 8, "Golomb-Rice stream of ",
                   bits.size(), " bytes cannot hold ", k, " positions with b = ", b);
  std::vector<uint32_t> idx(k);
  BitReader r(bits);
  uint64_t next = 0;
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t q = r.unary();
    CC_PAYLOAD_CHECK(q < ((n - next) >> b) + 1, "Golomb-Rice position ", i, " runs past ", n);
    const uint64_t gap = (q << b) | r.bits(b);
    CC_PAYLOAD_CHECK(gap < n - next, "Golomb-Rice position ", i, " (gap ", gap,
                     ") runs past the tensor's ", n, " elements");
    idx[i] = static_cast<uint32_t>(next + gap);
    next += gap + 1;
  }
  CC_PAYLOAD_CHECK(r.remaining() < 8, "Golomb-Rice stream has ", r.remaining(),
                   " trailing bits after ", k, " positions");
  CC_PAYLOAD_CHECK(r.remaining() == 0 || r.bits(static_cast<int>(r.remaining())) == 0,
                   "Golomb-Rice stream has non-zero padding");
  return idx;
}

}  // namespace compcoll
