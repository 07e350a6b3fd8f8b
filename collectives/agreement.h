// Agreement before trust: ranks exchange their effective configuration once
// per communicator. A mismatch is an error on every rank that names the
// settings and the ranks that differ, never a hang or silently different
// math.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "collectives/comm.h"
#include "compcoll/error.h"

namespace compcoll {

// description: "key=value;key=value;..." (e.g. "algo=dgc;" + AlgoParams::canonical()).
// Collective. Throws ErrorKind::kMismatch on every rank when any rank's
// description differs from rank 0's.
// Descriptions longer than kMaxAgreementBytes are refused (kInvalidArgument)
// and so are peers announcing longer ones: the configuration is a few
// hundred bytes.
constexpr size_t kMaxAgreementBytes = 64 * 1024;
// What every part of the exchange starts with on the wire. Another exchange
// a rank may run at the same point (the interposer's host ids) accepts
// parts of kMaxSetupPartBytes, so that it can name a rank that is here
// instead of refusing its part as oversized.
constexpr std::string_view kAgreementTag = "compcoll:agreement:";
constexpr size_t kMaxSetupPartBytes = kAgreementTag.size() + kMaxAgreementBytes;
// What the ranks agree on and what a user does about a mismatch, for the
// error: the default words it as the compression configuration; a caller
// agreeing on something else (the benchmark's flags) names that instead.
struct AgreementSubject {
  const char* what = "the compression configuration";
  const char* remedy = "set the same COMPCOLL_* values everywhere";
};
void ensure_agreement(Comm& comm, const std::string& description, const AgreementSubject& subject = {});

// Collective: every rank says whether its part of a setup step worked
// (my_error empty) or why not. Any failure throws `kind` (kTransport unless
// told) on every rank: "<step>: rank R: <its error>; ...", so no rank goes on
// with peers that gave up. Errors are cut to 1 KiB each.
void agree_step_succeeded(Comm& world, const std::string& step, const std::string& my_error,
                          ErrorKind kind = ErrorKind::kTransport);

// Collective: a random 64-bit number chosen by rank 0, the same on every
// rank (names of shared resources that must not collide between
// communicators).
uint64_t shared_nonce(Comm& world);

// FNV-1a of the description, for logs.
uint64_t config_hash(const std::string& description);

}  // namespace compcoll
