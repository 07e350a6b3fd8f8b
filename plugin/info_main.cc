// compcoll-info: every configuration variable (type, default, current value,
// doc) and every registered algorithm. Exits non-zero, printing the error,
// when the environment holds an invalid value.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "collectives/registry.h"
#include "plugin/config.h"

int main() {
  using namespace compcoll;
  std::printf("compcoll configuration (COMPCOLL_* environment variables)\n\n");
  std::printf("%-26s %-7s %-8s %-12s %s\n", "variable", "type", "default", "current", "allowed / doc");
  for (const ConfigVar& v : config_table()) {
    const char* cur = std::getenv(v.name);
    std::printf("%-26s %-7s %-8s %-12s %s\n%-57s %s\n", v.name, var_type_name(v.type),
                *v.default_value ? v.default_value : "(unset)", cur ? cur : "(unset)", v.allowed, "",
                v.doc);
  }
  std::printf("\nalgorithms (COMPCOLL_ALGO)\n\n");
  for (const AlgorithmDescriptor& a : algorithm_table()) {
    std::printf("  %-8s %s\n", a.name, a.description);
  }
  try {
    const Config cfg = load_config();
    std::printf("\nthe current environment is valid: algo %s, %s\n", cfg.algo.c_str(),
                cfg.agreement_description().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ncompcoll-info: invalid configuration: %s\n", e.what());
    return 1;
  }
}
