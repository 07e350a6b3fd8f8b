#include "integration/bench/args.h"

#include <cstdlib>
#include <sstream>

#include "compcoll/error.h"

namespace compcoll::bench {

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      want_help_ = true;
      continue;
    }
    CC_CHECK(a.rfind("--", 0) == 0, kInvalidArgument, "unexpected argument '", a,
             "' (flags look like --name value)");
    std::string name = a.substr(2), value = "1";
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    }
    values_[name] = value;
  }
}

std::string Args::str(const std::string& name, const std::string& def, const std::string& help) {
  help_.push_back("  --" + name + (def.empty() ? "" : " (default " + def + ")") + "\n      " + help);
  used_[name] = true;
  const auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

double Args::num(const std::string& name, double def, const std::string& help) {
  std::ostringstream d;
  d << def;
  const std::string s = str(name, d.str(), help);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  CC_CHECK(!s.empty() && end && *end == '\0', kInvalidArgument, "--", name, ": '", s,
           "' is not a number");
  return v;
}

long long Args::integer(const std::string& name, long long def, const std::string& help) {
  const std::string s = str(name, std::to_string(def), help);
  return parse_count("--" + name, s);
}

bool Args::flag(const std::string& name, const std::string& help) {
  help_.push_back("  --" + name + "\n      " + help);
  used_[name] = true;
  return values_.count(name) > 0;
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

long long parse_count(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  CC_CHECK(!s.empty() && end != s.c_str() && v >= 0, kInvalidArgument, flag, ": '", s,
           "' is not a non-negative integer");
  long long mult = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k") mult = 1LL << 10;
  else if (suffix == "M" || suffix == "m") mult = 1LL << 20;
  else if (suffix == "G" || suffix == "g") mult = 1LL << 30;
  else CC_CHECK(suffix.empty(), kInvalidArgument, flag, ": '", s, "' has unknown suffix '", suffix,
                "' (allowed: K, M, G)");
  return v * mult;
}

}  // namespace compcoll::bench
