// Whether this process can write files into a directory later: the one check
// behind COMPCOLL_STATS_FILE's and COMPCOLL_STATE_DIR's start-up validation,
// so that a long run does not end with its output lost and a warning nobody
// reads. Each caller phrases the outcome for its own setting.
#pragma once

#include <string>

namespace compcoll {

struct DirCheck {
  enum class Problem { kNone, kCannotCreate, kNotADirectory, kNotWritable };
  Problem problem = Problem::kNone;
  std::string reason;  // the system's words for kCannotCreate and kNotWritable

  bool ok() const { return problem == Problem::kNone; }
};

// Creates dir (and its parents) when missing, then checks that it is a
// directory this process may create files in.
DirCheck prepare_writable_dir(const std::string& dir);

}  // namespace compcoll
