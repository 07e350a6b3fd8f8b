// A small "--flag value" parser for compcoll-bench: every flag is declared
// with its help text, unknown flags and malformed values are errors that
// name the flag.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace compcoll::bench {

class Args {
 public:
  // argv after the subcommand.
  Args(int argc, char** argv, int first);

  // Declares a flag (with its default) and returns its value.
  std::string str(const std::string& name, const std::string& def, const std::string& help);
  double num(const std::string& name, double def, const std::string& help);
  long long integer(const std::string& name, long long def, const std::string& help);
  bool flag(const std::string& name, const std::string& help);  // present or not

  // After all declarations: throws on flags nobody declared; returns false
  // (and fills usage) when --help was given.
  bool finish(std::string* usage);

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
  std::vector<std::string> help_;
  bool want_help_ = false;
};

std::vector<std::string> split_list(const std::string& s);
// Parses counts like "25557032", "4K", "128M" (binary multiples).
long long parse_count(const std::string& flag, const std::string& s);

}  // namespace compcoll::bench
