// A configuration environment made of a map, for load_config and
// inert_settings in tests: unset names look up as nullopt.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "plugin/config.h"

namespace compcoll {

inline EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace compcoll
