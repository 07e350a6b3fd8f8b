#include "integration/bench/bench_rows.h"

#include <cmath>
#include <cstdlib>

#include "compcoll/error.h"

namespace compcoll::bench {
namespace {

class Reader {
 public:
  Reader(const std::string& text, size_t pos) : s_(text), p_(pos) {}

  void skip_space() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\r' || s_[p_] == '\t'))
      ++p_;
  }
  bool peek(char c) {
    skip_space();
    return p_ < s_.size() && s_[p_] == c;
  }
  void expect(char c) {
    CC_CHECK(peek(c), kInvalidArgument, "benchmark JSON: expected '", c, "' at offset ", p_,
             p_ < s_.size() ? "" : " (end of text)");
    ++p_;
  }
  std::string string_value() {
    expect('"');
    std::string out;
    while (p_ < s_.size() && s_[p_] != '"') {
      char c = s_[p_++];
      if (c == '\\') {
        CC_CHECK(p_ < s_.size(), kInvalidArgument, "benchmark JSON: string ends in an escape");
        c = s_[p_++];
        if (c == 'u') {  // json.h writes control characters as \u00XX
          CC_CHECK(p_ + 4 <= s_.size(), kInvalidArgument, "benchmark JSON: short \\u escape at ", p_);
          c = static_cast<char>(std::strtol(s_.substr(p_, 4).c_str(), nullptr, 16));
          p_ += 4;
        } else if (c == 'n') {
          c = '\n';
        } else if (c == 't') {
          c = '\t';
        }
      }
      out += c;
    }
    CC_CHECK(p_ < s_.size(), kInvalidArgument, "benchmark JSON: unterminated string");
    ++p_;
    return out;
  }
  std::string literal() {  // number, true, false, null
    skip_space();
    const size_t start = p_;
    while (p_ < s_.size() && s_[p_] != ',' && s_[p_] != '}' && s_[p_] != ']' && s_[p_] != ' ' &&
           s_[p_] != '\n')
      ++p_;
    CC_CHECK(p_ > start, kInvalidArgument, "benchmark JSON: missing value at offset ", start);
    return s_.substr(start, p_ - start);
  }
  JsonRow object() {
    JsonRow row;
    expect('{');
    if (peek('}')) return ++p_, row;
    do {
      std::string key = string_value();
      expect(':');
      CC_CHECK(!row.count(key), kInvalidArgument, "benchmark JSON: key \"", key, "\" twice");
      row[key] = peek('"') ? string_value() : literal();
    } while (peek(',') && ++p_);
    expect('}');
    return row;
  }

 private:
  const std::string& s_;
  size_t p_;
};

}  // namespace

std::vector<JsonRow> parse_json_rows(const std::string& text) {
  std::vector<JsonRow> rows;
  // The list opens with "[{" or is "[]"; a '[' inside a progress line is not it.
  size_t start = text.find("[{");
  const size_t empty = text.find("[]");
  if (empty < start) return rows;
  if (start == std::string::npos) return rows;
  Reader r(text, start);
  r.expect('[');
  do rows.push_back(r.object());
  while (r.peek(',') && (r.expect(','), true));
  r.expect(']');
  return rows;
}

const std::string& row_text(const JsonRow& row, const std::string& key) {
  const auto it = row.find(key);
  CC_CHECK(it != row.end(), kInvalidArgument, "benchmark JSON: no \"", key, "\" in the row");
  return it->second;
}

double row_number(const JsonRow& row, const std::string& key) {
  const std::string& v = row_text(row, key);
  if (v == "null") return NAN;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  CC_CHECK(!v.empty() && end == v.c_str() + v.size(), kInvalidArgument, "benchmark JSON: \"", key,
           "\" is '", v, "', not a number");
  return d;
}

}  // namespace compcoll::bench
