// read_jsonl(): the string fields `keys` of every line of a JSONL file.
// Every rank may call it on the same file and gets the same records or the same
// collective error, which names file:line and the key: a missing file, a line that is
// not a JSON object, a missing key, a value that is not a string. Blank lines are
// skipped; with skip_bad_lines, bad lines are skipped too and counted in *n_skipped.
// A key listed in `optional_keys` may be missing (its field is then ""). A key listed
// in `json_keys` may hold any JSON value: a string is kept as its text, anything else
// as its JSON text with raw_json set.
#pragma once

#include <string>
#include <vector>

namespace slimpi {

struct JsonlRecord {
  int64_t line = 0;                 // 1-based line in the file
  std::vector<std::string> fields;  // in the order of `keys`
  std::vector<bool> raw_json;       // per field: it is JSON text (a non-string value)
  std::vector<bool> present;        // per field: the line has the key (optional keys may lack it)
};

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::vector<std::string>& keys,
                                    bool skip_bad_lines = false, int64_t* n_skipped = nullptr,
                                    const std::vector<std::string>& optional_keys = {},
                                    const std::vector<std::string>& json_keys = {});

}  // namespace slimpi
