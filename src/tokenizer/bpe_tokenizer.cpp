#include "tokenizer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <slimpi/error.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <tuple>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace slimpi {
namespace {

using nlohmann::json;

// UTF-8 encoding of one code point.
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Length of the UTF-8 character starting with byte c (1 for a stray continuation byte).
size_t utf8_length(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// GPT-2's byte <-> printable character table: bytes that are printable Latin-1 map to
// themselves, the other 68 to U+0100 onwards, in byte order.
struct ByteLevelTable {
  std::array<std::string, 256> to_char;        // byte -> its character, UTF-8
  std::unordered_map<uint32_t, uint8_t> to_byte;  // code point -> byte
  ByteLevelTable() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? uint32_t(b) : next++;
      append_utf8(to_char[b], cp);
      to_byte[cp] = uint8_t(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable t;
  return t;
}

const char* kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// A compiled PCRE2 pattern (UTF, Unicode properties, JIT when available).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      SLIMPI_FAIL("{}: regex '{}' does not compile at offset {}: {}", where, pattern, offset,
                  reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Tokenizers' Split with behaviour Isolated: every match is a piece, and so is every
  // non-empty stretch between matches.
  void split(const std::string& s, std::vector<std::string>& out) const {
    size_t pos = 0, gap = 0;
    while (pos <= s.size()) {
      // The subject's UTF-8 is validated once, by the first call: re-checking it on every
      // call would make a long piece cost O(n²).
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 pos > 0 ? PCRE2_NO_UTF_CHECK : 0, match_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      SLIMPI_CHECK(rc > 0, "tokenizer regex match failed ({})", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one character
        pos = b + (b < s.size() ? utf8_length(static_cast<unsigned char>(s[b])) : 1);
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      pos = gap = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
};

struct PreTokenizer {
  enum Kind { Split, ByteLevel } kind;
  std::unique_ptr<Regex> regex;  // Split, or ByteLevel with use_regex
  bool add_prefix_space = false;
};

struct AddedToken {
  int64_t id;
  std::string content;
  bool special;
};

}  // namespace

struct BpeTokenizer::Impl {
  std::string path;
  bool nfc = false;
  std::vector<PreTokenizer> pre;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false;
  std::vector<AddedToken> added;                      // longest first within a first byte
  std::array<std::vector<int>, 256> added_by_first;  // indices into `added`
  std::unordered_map<int64_t, int> added_by_id;
  std::vector<int64_t> prefix_ids;  // the post-processor's specials before the sequence
  std::vector<int64_t> suffix_ids;  // ... and after it
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void load(const json& j);
  void encode_piece(const std::string& piece, std::vector<int64_t>& out) const;
  void merge_all(std::vector<int32_t>& symbols) const;
  void encode_plain(const std::string& text, std::vector<int64_t>& out) const;
};

namespace {

std::string describe(const json& j) { return j.is_object() ? j.value("type", std::string("?")) : j.dump(); }

void load_normalizer(const json& n, bool& nfc, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    for (const auto& sub : n.at("normalizers")) load_normalizer(sub, nfc, where);
  } else {
    SLIMPI_FAIL("{}: normalizer '{}' is not supported (NFC, Sequence of NFC)", where, describe(n));
  }
}

void load_pre_tokenizer(const json& p, std::vector<PreTokenizer>& out, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& sub : p.at("pretokenizers")) load_pre_tokenizer(sub, out, where);
  } else if (type == "Split") {
    SLIMPI_CHECK(p.value("behavior", "") == "Isolated" && !p.value("invert", false),
                 "{}: Split pre-tokenizer with behavior '{}' (invert {}) is not supported (Isolated)", where,
                 p.value("behavior", ""), p.value("invert", false));
    const json& pattern = p.at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern["Regex"].get<std::string>();
    } else {  // a literal string: escaped
      for (char c : pattern.at("String").get<std::string>()) {
        if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) regex += '\\';
        regex += c;
      }
    }
    out.push_back({PreTokenizer::Split, std::make_unique<Regex>(regex, where), false});
  } else if (type == "ByteLevel") {
    PreTokenizer b{PreTokenizer::ByteLevel, nullptr, p.value("add_prefix_space", false)};
    if (p.value("use_regex", true)) b.regex = std::make_unique<Regex>(kGpt2Regex, where);
    out.push_back(std::move(b));
  } else {
    SLIMPI_FAIL("{}: pre-tokenizer '{}' is not supported (Split, ByteLevel, Sequence)", where, describe(p));
  }
}

}  // namespace

void BpeTokenizer::Impl::load(const json& j) {
  const std::string& where = path;
  const json& model = j.at("model");
  SLIMPI_CHECK(model.value("type", "") == "BPE", "{}: model type '{}' is not supported (a byte-level BPE)", where,
               model.value("type", ""));
  SLIMPI_CHECK(model.value("dropout", json()).is_null(), "{}: BPE dropout is not supported", where);
  SLIMPI_CHECK(!model.value("byte_fallback", false), "{}: byte_fallback is not supported (a byte-level BPE)", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    SLIMPI_CHECK(model.value(key, json()).is_null() || model[key] == "", "{}: BPE {} is not supported", where, key);
  ignore_merges = model.value("ignore_merges", false);
  for (const auto& [token, id] : model.at("vocab").items()) {
    const int32_t i = id.get<int32_t>();
    SLIMPI_CHECK(i >= 0 && i < (1 << 28), "{}: vocabulary id {} of '{}' is out of range", where, i, token);
    vocab[token] = i;
    if (int64_t(id_to_token.size()) <= i) id_to_token.resize(i + 1);
    id_to_token[i] = token;
  }
  int32_t rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string left, right;
    if (m.is_array()) {
      left = m.at(0).get<std::string>();
      right = m.at(1).get<std::string>();
    } else {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      SLIMPI_CHECK(space != std::string::npos, "{}: merge '{}' is not 'left right'", where, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    }
    auto a = vocab.find(left), b = vocab.find(right), ab = vocab.find(left + right);
    SLIMPI_CHECK(a != vocab.end() && b != vocab.end() && ab != vocab.end(),
                 "{}: merge {} of '{}' + '{}' names tokens not in the vocabulary", where, rank, left, right);
    merges.emplace((uint64_t(uint32_t(a->second)) << 32) | uint32_t(b->second), std::pair{rank, ab->second});
    ++rank;
  }
  for (const auto& t : j.value("added_tokens", json::array())) {
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      SLIMPI_CHECK(!t.value(flag, false), "{}: added token '{}' has {} = true, which is not supported", where,
                   t.value("content", ""), flag);
    AddedToken a{t.at("id").get<int64_t>(), t.at("content").get<std::string>(), t.value("special", false)};
    SLIMPI_CHECK(!a.content.empty(), "{}: an added token (id {}) is empty", where, a.id);
    added_by_id[a.id] = int(added.size());
    added.push_back(a);
  }
  for (size_t i = 0; i < added.size(); ++i) added_by_first[static_cast<unsigned char>(added[i].content[0])].push_back(int(i));
  for (auto& list : added_by_first)  // longest first: the longest match at a position wins
    std::stable_sort(list.begin(), list.end(),
                     [&](int a, int b) { return added[a].content.size() > added[b].content.size(); });
  load_normalizer(j.value("normalizer", json()), nfc, where);
  load_pre_tokenizer(j.value("pre_tokenizer", json()), pre, where);
  SLIMPI_CHECK(std::any_of(pre.begin(), pre.end(), [](const auto& p) { return p.kind == PreTokenizer::ByteLevel; }),
               "{}: no ByteLevel pre-tokenizer: only byte-level BPE tokenizers are supported", where);
  // The post-processor: a ByteLevel one changes offsets only; a template adds specials.
  std::function<void(const json&)> post = [&](const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      for (const auto& sub : p.at("processors")) post(sub);
      return;
    }
    SLIMPI_CHECK(type == "TemplateProcessing", "{}: post-processor '{}' is not supported", where, type);
    bool before = true;
    for (const auto& item : p.at("single")) {
      if (item.contains("Sequence")) {
        before = false;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      for (const auto& id : p.at("special_tokens").at(name).at("ids"))
        (before ? prefix_ids : suffix_ids).push_back(id.get<int64_t>());
    }
  };
  post(j.value("post_processor", json()));
  const json decoder = j.value("decoder", json());
  SLIMPI_CHECK(decoder.is_null() || decoder.value("type", "") == "ByteLevel",
               "{}: decoder '{}' is not supported (ByteLevel)", where, describe(decoder));
}

// Merges the adjacent pair of lowest rank, leftmost on ties, until no pair is in the
// merge table: the order of tokenizers' priority queue (a merge's own pairs rank after
// it, so popping (rank, position) minima is the same as rescanning for the minimum).
// A heap of candidate pairs over a linked list of symbols: O(n log n) in the piece's
// length (a rescan per merge would be O(n²): minutes for a 100 kB run of letters).
void BpeTokenizer::Impl::merge_all(std::vector<int32_t>& symbols) const {
  const int n = int(symbols.size());
  if (n < 2) return;
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return std::tie(rank, left) > std::tie(o.rank, o.left); }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    auto it = merges.find((uint64_t(uint32_t(symbols[l])) << 32) | uint32_t(symbols[r]));
    if (it != merges.end()) heap.push({it->second.first, l, r, symbols[l], symbols[r]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale: a side was merged away or changed since this pair was queued.
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || symbols[c.left] != c.left_id ||
        symbols[c.right] != c.right_id)
      continue;
    symbols[c.left] = merges.at((uint64_t(uint32_t(c.left_id)) << 32) | uint32_t(c.right_id)).second;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  std::vector<int32_t> merged;
  for (int i = 0; i >= 0; i = next[i]) merged.push_back(symbols[i]);
  symbols.swap(merged);
}

void BpeTokenizer::Impl::encode_piece(const std::string& piece, std::vector<int64_t>& out) const {
  if (auto hit = cache.find(piece); hit != cache.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> symbols;
  if (auto whole = vocab.find(piece); ignore_merges && whole != vocab.end()) {
    symbols.push_back(whole->second);
  } else {
    for (size_t i = 0; i < piece.size();) {  // one symbol per character
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      auto it = vocab.find(piece.substr(i, n));
      SLIMPI_CHECK(it != vocab.end(), "{}: character '{}' is not in the vocabulary", path, piece.substr(i, n));
      symbols.push_back(it->second);
      i += n;
    }
    merge_all(symbols);
  }
  if (cache.size() > (1u << 18)) cache.clear();  // bounded: a long run of new words cannot grow it without end
  cache.emplace(piece, symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeTokenizer::Impl::encode_plain(const std::string& raw, std::vector<int64_t>& out) const {
  if (raw.empty()) return;
  std::string text = raw;
  if (nfc) {
    utf8proc_uint8_t* normalized = nullptr;  // by length: a NUL inside the text is kept
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(raw.data()),
                                            utf8proc_ssize_t(raw.size()), &normalized,
                                            utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    SLIMPI_CHECK(n >= 0, "{}: text is not valid UTF-8 (NFC normalizer): {}", path, utf8proc_errmsg(n));
    text.assign(reinterpret_cast<const char*>(normalized), size_t(n));
    std::free(normalized);
  }
  std::vector<std::string> pieces{text}, next;
  for (const auto& p : pre) {
    next.clear();
    for (auto& piece : pieces) {
      if (p.kind == PreTokenizer::Split) {
        p.regex->split(piece, next);
        continue;
      }
      if (p.add_prefix_space && !piece.empty() && piece[0] != ' ') piece.insert(0, 1, ' ');
      std::vector<std::string> parts;
      if (p.regex) p.regex->split(piece, parts);
      else parts.push_back(std::move(piece));
      for (const auto& part : parts) {
        std::string mapped;
        for (unsigned char c : part) mapped += byte_level().to_char[c];
        next.push_back(std::move(mapped));
      }
    }
    pieces.swap(next);
  }
  for (const auto& piece : pieces) encode_piece(piece, out);
}

BpeTokenizer::BpeTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  impl_->path = fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  std::ifstream in(impl_->path);
  SLIMPI_CHECK(in, "cannot read tokenizer {}", impl_->path);
  json j;
  try {
    j = json::parse(in);
    impl_->load(j);
  } catch (const json::exception& e) {
    SLIMPI_FAIL("{}: malformed tokenizer.json: {}", impl_->path, e.what());
  }
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, bool with_specials) const {
  const Impl& m = *impl_;
  std::vector<int64_t> out;
  if (with_specials) out = m.prefix_ids;
  // Added tokens first: at each position the longest one starting there, scanning for
  // bytes that begin one.
  size_t plain_begin = 0;
  for (size_t i = 0; i < text.size();) {
    int found = -1;
    for (int a : m.added_by_first[static_cast<unsigned char>(text[i])])
      if (text.compare(i, m.added[a].content.size(), m.added[a].content) == 0) {
        found = a;
        break;
      }
    if (found < 0) {
      ++i;
      continue;
    }
    m.encode_plain(std::string(text.substr(plain_begin, i - plain_begin)), out);
    out.push_back(m.added[found].id);
    i += m.added[found].content.size();
    plain_begin = i;
  }
  m.encode_plain(std::string(text.substr(plain_begin)), out);
  if (with_specials) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  const auto& to_byte = byte_level().to_byte;
  for (int64_t id : ids) {
    const std::string* token = nullptr;
    if (auto a = m.added_by_id.find(id); a != m.added_by_id.end()) {
      if (skip_special && m.added[a->second].special) continue;
      token = &m.added[a->second].content;
    } else {
      // An id the tokenizer does not have (a model's padded vocabulary rows, e.g.
      // Qwen2.5's 151936 logits over 151665 tokens) decodes to nothing, as in tokenizers.
      if (id < 0 || id >= int64_t(m.id_to_token.size()) || m.id_to_token[id].empty()) continue;
      token = &m.id_to_token[id];
    }
    // Byte-level characters back to bytes (what tokenizers' ByteLevel decoder does with
    // every token's characters; a character outside the table is kept as it is).
    for (size_t i = 0; i < token->size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>((*token)[i])), token->size() - i);
      utf8proc_int32_t cp = 0;
      const auto used = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token->data() + i), long(n), &cp);
      auto b = used > 0 ? to_byte.find(uint32_t(cp)) : to_byte.end();
      if (b != to_byte.end()) out += char(b->second);
      else out.append(*token, i, n);
      i += n;
    }
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const {
  int64_t n = int64_t(impl_->id_to_token.size());
  for (const auto& a : impl_->added) n = std::max(n, a.id + 1);
  return n;
}

int64_t BpeTokenizer::token_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::path() const { return impl_->path; }

}  // namespace slimpi
