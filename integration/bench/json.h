// Minimal JSON object writer for the benchmark's --json output.
#pragma once

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace compcoll::bench {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& v) {
    return raw(key, "\"" + escape(v) + "\"");
  }
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  JsonObject& add(const std::string& key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return raw(key, buf);
  }
  JsonObject& add(const std::string& key, long long v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, unsigned long long v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, int v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, size_t v) { return raw(key, std::to_string(v)); }

  std::string str() const {
    std::ostringstream os;
    os << "{";
    for (size_t i = 0; i < fields_.size(); ++i) os << (i ? ", " : "") << fields_[i];
    os << "}";
    return os.str();
  }

 private:
  JsonObject& raw(const std::string& key, const std::string& v) {
    fields_.push_back("\"" + escape(key) + "\": " + v);
    return *this;
  }
  static std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        o += buf;
        continue;
      }
      o += c;
    }
    return o;
  }
  std::vector<std::string> fields_;
};

inline std::string json_list(const std::vector<JsonObject>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ",\n " : "") + items[i].str();
  return s + "]";
}

}  // namespace compcoll::bench
