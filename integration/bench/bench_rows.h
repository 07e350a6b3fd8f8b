// Reads back the benchmark's own --json output: a list of flat objects, as
// json.h writes them (string, number, true/false/null values; no nesting).
// One reader for `project --validate` (which reads `allreduce --json`) and
// the tests (which read both), so a change of the writer breaks one place.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace compcoll::bench {

// key -> value text; strings are unescaped and without their quotes,
// everything else is the literal text ("12.5", "true", "null").
using JsonRow = std::map<std::string, std::string>;

// The rows of the first JSON list of objects in `text` (the output may
// carry progress lines before it). No list: an empty vector. A list that
// is not well formed is an error (kInvalidArgument) naming the offset.
std::vector<JsonRow> parse_json_rows(const std::string& text);

// The numeric value of `key`; an error naming the key when it is missing
// or not a number ("null" reads as NaN).
double row_number(const JsonRow& row, const std::string& key);

// The text of `key`; an error naming the key when it is missing.
const std::string& row_text(const JsonRow& row, const std::string& key);

}  // namespace compcoll::bench
