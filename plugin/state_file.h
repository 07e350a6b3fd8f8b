// The on-disk form of one rank's error-feedback state (a checkpoint of a
// communicator's StateStore), so that a resumed run continues with the
// residuals, momenta and step counters it stopped with.
//
// Layout (little-endian, as written by this machine; the magic's byte
// order tells a reader of another endianness that it cannot use the file):
//
//   "CCSTATE1"                      8-byte magic
//   u32 version (5; 2 to 4 are read too: optimizer momentum 0 before 3,
//                               its kind "handed over" before 4, no
//                               second moments before 5)
//   u64 config hash                 FNV-1a of the description below
//   u32 n, n bytes                  the agreement description (the math's settings)
//   i32 rank, i32 world size        state is per rank and shaped by P (onebit)
//   u64 clock                       the store's call clock (eviction ages)
//   f32 optimizer momentum          COMPCOLL_MOMENTUM_HANDOVER=auto's m; 0: none
//                                   (version 3 on)
//   u8 moved                        1: m was moved out of the optimizer (Adam's
//                                   beta1), 0: handed over (version 4 on)
//   u32 entries, then per entry:
//     u32 n, n bytes                key text ("key:..." as StateKey::str())
//     u64 idle                      calls since its last use
//     u64 steps, f32 lambda
//     u64 |v|, u64 |u|, u64 |regions|, u64 |handed|, then v, u (float32),
//     regions (u64), handed (float32)
//     u64 |second moment|, then it (float32)  (version 5 on: normalized selection)
//   u64 FNV-1a of every byte before it
//
// Parsing checks every length against the bytes left before reading, the
// checksum before anything else, and refuses trailing bytes: a truncated or
// corrupted file is an error naming the problem, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/momentum_handover.h"
#include "compcoll/types.h"
#include "compression/codec.h"

namespace compcoll {

struct StateFileEntry {
  std::string key;  // StateKey::str() form
  uint64_t idle = 0;
  const CodecState* state = nullptr;  // what is written; parsing points it at owned
  std::unique_ptr<CodecState> owned;  // parsed entries own their state
};

struct StateFile {
  uint64_t config_hash = 0;
  std::string description;
  int rank = 0;
  int world_size = 0;
  uint64_t clock = 0;
  OptimizerMomentum optimizer_momentum;  // Communicator::adopt_optimizer_momentum's
  std::vector<StateFileEntry> entries;
};

// 2: the hand-over mirror; 3: the momentum taken from the optimizer; 4:
// whether it was moved out of the optimizer (Adam) or handed over (SGD).
constexpr uint32_t kStateFileVersion = 5;
constexpr uint32_t kOldestStateFileVersion = 2;

// Entries are written in the order given (callers sort them by key so that
// equal states give equal files).
Bytes serialize_state_file(const StateFile& file);

// Throws ErrorKind::kInvalidArgument ("compcoll state file: ...") when the
// bytes are not a complete, intact state file of this version.
StateFile parse_state_file(std::span<const uint8_t> bytes);

// Whole-file helpers. read_binary_file throws kInvalidArgument naming the
// path when it cannot be read; write_binary_file_atomically returns false
// when the file cannot be written (temporary file + rename).
Bytes read_binary_file(const std::string& path);
bool write_binary_file_atomically(const std::string& path, std::span<const uint8_t> bytes);
// Why dir cannot take checkpoints (it is created when missing, and must be
// a directory this process may write to), or "" when it can.
std::string state_dir_problem(const std::string& dir);

}  // namespace compcoll
