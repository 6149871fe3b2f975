// read_jsonl(): the string fields `keys` of every line of a JSONL file.
// Every rank may call it on the same file and gets the same records or the same
// collective error, which names file:line and the key: a missing file, a line that is
// not a JSON object, a missing key, a value that is not a string. Blank lines are
// skipped.
#pragma once

#include <string>
#include <vector>

namespace slimpi {

struct JsonlRecord {
  int64_t line = 0;                 // 1-based line in the file
  std::vector<std::string> fields;  // in the order of `keys`
};

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::vector<std::string>& keys);

}  // namespace slimpi
