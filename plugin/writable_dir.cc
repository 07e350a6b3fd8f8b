#include "plugin/writable_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace compcoll {

DirCheck prepare_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return {DirCheck::Problem::kCannotCreate, ec.message()};
  if (!std::filesystem::is_directory(dir, ec)) return {DirCheck::Problem::kNotADirectory, {}};
  // W_OK | X_OK: creating a file needs both (the temporary file, then rename).
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return {DirCheck::Problem::kNotWritable, std::strerror(errno)};
  }
  return {};
}

}  // namespace compcoll
