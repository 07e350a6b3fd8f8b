// Running a program as a child process with exactly the environment given,
// bounded in time: how the interposer tests start the unmodified NCCL
// program (here with the stand-ins, in tests/gpu with the real NCCL).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace compcoll::testing {

struct AppRun {
  int exit_code = -1;  // -signal when killed; 124 when it ran past the limit
  std::string output;  // stdout and stderr together
  double seconds = 0.0;
};

// Runs argv with exactly `env` as its environment (nothing inherited),
// bounded by `limit`.
AppRun run_program(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                   std::chrono::seconds limit);

// Lines of text that start with prefix, with the prefix removed.
std::vector<std::string> lines_after(const std::string& text, const std::string& prefix);
std::string read_text(const std::string& path);
// The integer after "key": in a flat JSON text, -1 when absent.
long long json_int(const std::string& json, const std::string& key);

}  // namespace compcoll::testing
