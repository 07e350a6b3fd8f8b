#include "collectives/agreement.h"

#include <unistd.h>

#include <map>
#include <random>
#include <sstream>
#include <string_view>

#include "compcoll/error.h"

namespace compcoll {
namespace {

std::map<std::string, std::string> parse(std::string_view s) {
  std::map<std::string, std::string> kv;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(';', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    const size_t eq = item.find('=');
    kv[std::string(item.substr(0, eq))] =
        eq == std::string_view::npos ? "" : std::string(item.substr(eq + 1));
    pos = end + 1;
  }
  return kv;
}

}  // namespace

uint64_t config_hash(const std::string& description) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : description) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void ensure_agreement(Comm& comm, const std::string& description, const AgreementSubject& subject) {
  CC_CHECK_LE(description.size(), kMaxAgreementBytes, kInvalidArgument,
              "the configuration description is ", description.size(), " bytes, more than ",
              kMaxAgreementBytes);
  // Tagged on the wire only (the description, and so its hash, is as
  // given): a rank at another step of setting up the communicator sends
  // something else here, and is named instead of being parsed as settings.
  const std::string mine = std::string(kAgreementTag) + description;
  const Gathered all = comm.allgatherv(
      {reinterpret_cast<const uint8_t*>(mine.data()), mine.size()},
      kAgreementTag.size() + kMaxAgreementBytes);
  std::ostringstream absent;
  for (int r = 0; r < all.parts(); ++r) {
    const auto p = all.part(r);
    const std::string_view got(reinterpret_cast<const char*>(p.data()), p.size());
    if (got.rfind(kAgreementTag, 0) != 0) absent << (absent.tellp() > 0 ? ", " : "") << r;
  }
  CC_CHECK(absent.tellp() == 0, kMismatch, "rank(s) ", absent.str(),
           " did not take part in the agreement on ", subject.what, " (seen by rank ",
           comm.rank(), "): they were at another step of setting up the communicator, which "
           "happens when a setting that decides those steps (COMPCOLL_NCCL_COMMS, say) differs "
           "between ranks; ", subject.remedy);
  const auto part = [&](int r) {
    const auto p = all.part(r);
    return std::string_view(reinterpret_cast<const char*>(p.data()), p.size())
        .substr(kAgreementTag.size());
  };
  const auto reference = parse(part(0));
  std::ostringstream diff;
  int differing = 0;
  for (int r = 1; r < all.parts(); ++r) {
    if (part(r) == part(0)) continue;
    ++differing;
    const auto mine = parse(part(r));
    for (const auto& [key, value] : reference) {
      const auto it = mine.find(key);
      const std::string other = it == mine.end() ? "(unset)" : it->second;
      if (other != value) diff << "\n  " << key << ": rank 0 has " << value << ", rank " << r << " has " << other;
    }
    for (const auto& [key, value] : mine) {
      if (!reference.count(key)) diff << "\n  " << key << ": rank 0 has (unset), rank " << r << " has " << value;
    }
  }
  CC_CHECK(differing == 0, kMismatch, "ranks disagree on ", subject.what, " (seen by rank ",
           comm.rank(), "; ", differing, " of ", all.parts(), " ranks differ from rank 0); ",
           subject.remedy, ":", diff.str());
}

void agree_step_succeeded(Comm& world, const std::string& step, const std::string& my_error,
                          ErrorKind kind) {
  constexpr size_t kMaxMessage = 1024;
  const std::string mine = my_error.substr(0, kMaxMessage);
  const Gathered all =
      world.allgatherv({reinterpret_cast<const uint8_t*>(mine.data()), mine.size()}, kMaxMessage);
  std::ostringstream failures;
  for (int r = 0; r < all.parts(); ++r) {
    const auto p = all.part(r);
    if (!p.empty()) {
      failures << (failures.tellp() > 0 ? "; " : "") << "rank " << r << ": "
               << std::string(reinterpret_cast<const char*>(p.data()), p.size());
    }
  }
  if (failures.tellp() > 0) {
    detail::throw_error(kind, __FILE__, __LINE__, step + ": " + failures.str());
  }
}

uint64_t shared_nonce(Comm& world) {
  uint64_t nonce = 0;
  if (world.rank() == 0) {
    std::random_device rd;
    nonce = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }
  world.broadcast(&nonce, sizeof nonce, 0);
  return nonce;
}

}  // namespace compcoll
