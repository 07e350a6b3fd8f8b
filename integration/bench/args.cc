#include "integration/bench/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "compcoll/error.h"

namespace compcoll::bench {

Args::Args(int argc, char** argv, int first) {
  const auto is_flag = [](const std::string& w) { return w.rfind("--", 0) == 0; };
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      want_help_ = true;
      continue;
    }
    CC_CHECK(is_flag(a), kInvalidArgument, "unexpected argument '", a,
             "' (flags look like --name value)");
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc && !is_flag(argv[i + 1]) && std::string(argv[i + 1]) != "-h") {
      // Tentatively this flag's value; flag() refuses it when the flag
      // takes none.
      value = argv[++i];
    }
    CC_CHECK(!name.empty(), kInvalidArgument, "'", a,
             "' is not a flag (flags look like --name value)");
    values_[name] = value;
  }
}

std::string Args::str(const std::string& name, const std::string& def, const std::string& help) {
  return value_of(name, def, help, "VALUE");
}

std::string Args::value_of(const std::string& name, const std::string& def, const std::string& help,
                           const char* placeholder) {
  help_.push_back("  --" + name + " " + placeholder + (def.empty() ? "" : " (default " + def + ")") +
                  "\n      " + help);
  used_[name] = true;
  const auto it = values_.find(name);
  if (it == values_.end() || want_help_) return def;
  CC_CHECK(it->second.has_value(), kInvalidArgument, "--", name,
           " needs a value (see --help)");
  CC_CHECK(!it->second->empty(), kInvalidArgument, "--", name,
           " was given an empty value (see --help)");
  return *it->second;
}

double Args::num(const std::string& name, double def, const std::string& help) {
  std::ostringstream d;
  d << def;
  const bool given = values_.count(name) > 0 && !want_help_;
  // A NaN default means "the algorithm's own default" and is not shown.
  const std::string s = value_of(name, std::isnan(def) ? "" : d.str(), help, "X");
  if (!given) return def;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  CC_CHECK(end && *end == '\0' && std::isfinite(v), kInvalidArgument, "--", name, ": '", s,
           "' is not a finite number");
  return v;
}

long long Args::integer(const std::string& name, long long def, const std::string& help) {
  const std::string s = value_of(name, std::to_string(def), help, "N");
  return parse_count("--" + name, s);
}

bool Args::flag(const std::string& name, const std::string& help) {
  help_.push_back("  --" + name + "\n      " + help);
  used_[name] = true;
  const auto it = values_.find(name);
  if (it == values_.end()) return false;
  CC_CHECK(want_help_ || !it->second.has_value(), kInvalidArgument, "--", name,
           " takes no value, but was given '", it->second.value_or(""), "'");
  return true;
}

bool Args::finish(std::string* usage) {
  if (want_help_) {
    std::ostringstream os;
    for (const auto& h : help_) os << h << "\n";
    *usage = os.str();
    return false;
  }
  for (const auto& [name, value] : values_) {
    CC_CHECK(used_.count(name), kInvalidArgument, "unknown flag --", name, " (see --help)");
  }
  return true;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> split_names(const std::string& flag, const std::string& s) {
  // "dgc,,sbc" or a trailing comma: most likely a name left out.
  CC_CHECK(s.empty() || (s.front() != ',' && s.back() != ',' && s.find(",,") == std::string::npos),
           kInvalidArgument, "--", flag, ": an empty name in '", s, "'");
  std::vector<std::string> out = split_list(s);
  CC_CHECK(!out.empty(), kInvalidArgument, "--", flag, ": no name given in '", s, "'");
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      CC_CHECK(out[i] != out[j], kInvalidArgument, "--", flag, ": '", out[i],
               "' is given twice (each name gets one row)");
    }
  }
  return out;
}

long long parse_count(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  CC_CHECK(!s.empty() && end != s.c_str() && v >= 0 && errno != ERANGE, kInvalidArgument, flag,
           ": '", s, "' is not a non-negative integer");
  long long mult = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k") mult = 1LL << 10;
  else if (suffix == "M" || suffix == "m") mult = 1LL << 20;
  else if (suffix == "G" || suffix == "g") mult = 1LL << 30;
  else CC_CHECK(suffix.empty(), kInvalidArgument, flag, ": '", s, "' has unknown suffix '", suffix,
                "' (allowed: K, M, G)");
  CC_CHECK(v <= std::numeric_limits<long long>::max() / mult, kInvalidArgument, flag, ": '", s,
           "' is too large");
  return v * mult;
}

size_t parse_size_in_floats(const std::string& flag, const std::string& s) {
  const long long bytes = parse_count(flag, s);
  CC_CHECK(bytes >= 4 && bytes % 4 == 0, kInvalidArgument, flag, ": '", s, "' is ", bytes,
           " bytes, not a whole number of float32 elements (a positive multiple of 4 bytes)");
  return static_cast<size_t>(bytes / 4);
}

}  // namespace compcoll::bench
