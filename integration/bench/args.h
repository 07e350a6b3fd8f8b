// A small "--flag value" parser for compcoll-bench: every flag is declared
// with its help text, unknown flags and malformed values are errors that
// name the flag.
//
// Values are bound lazily: the constructor only remembers what followed each
// "--name" (the next word unless it is another flag, or "=value"), and the
// declaration decides. A flag declared with str()/num()/integer() that was
// given without a value ("--ranks" last, or "--ranks --iters 3") or with an
// empty one is an error naming it; a flag() (present or not) that was given a
// value is an error too. Every subcommand gets this for every flag it
// declares, without per-flag code.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace compcoll::bench {

class Args {
 public:
  // argv after the subcommand.
  Args(int argc, char** argv, int first);

  // Declares a flag (with its default) and returns its value. Throws
  // kInvalidArgument when the flag was given without a value. With --help,
  // nothing is checked and the default comes back.
  std::string str(const std::string& name, const std::string& def, const std::string& help);
  double num(const std::string& name, double def, const std::string& help);
  long long integer(const std::string& name, long long def, const std::string& help);
  bool flag(const std::string& name, const std::string& help);  // present or not
  // Whether the command line named the flag (not its default).
  bool given(const std::string& name) const { return values_.count(name) != 0; }

  // After all declarations: throws on flags nobody declared; returns false
  // (and fills usage) when --help was given.
  bool finish(std::string* usage);

 private:
  // What followed each given flag: nullopt when nothing did.
  std::map<std::string, std::optional<std::string>> values_;
  std::map<std::string, bool> used_;
  // str() with the help line's placeholder: "--count N", "--algo VALUE".
  std::string value_of(const std::string& name, const std::string& def, const std::string& help,
                       const char* placeholder);
  std::vector<std::string> help_;
  bool want_help_ = false;
};

std::vector<std::string> split_list(const std::string& s);
// split_list for a flag that names things to run once each (--algo): an
// empty list or a name given twice is an error naming the flag.
std::vector<std::string> split_names(const std::string& flag, const std::string& s);
// Parses counts like "25557032", "4K", "128M" (binary multiples).
long long parse_count(const std::string& flag, const std::string& s);
// A message size in bytes ("4K", "1M") as a count of float32 elements: a
// size that is not a positive multiple of 4 bytes is an error naming it
// (it would otherwise be cut to whole floats, or to none).
size_t parse_size_in_floats(const std::string& flag, const std::string& s);

}  // namespace compcoll::bench
