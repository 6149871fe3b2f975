#include "reward/rational.h"

#include <cctype>
#include <numeric>

namespace slimpi {
namespace {

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> parse_digits(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

std::optional<Rational> make_rational(int64_t num, int64_t den) {
  if (den == 0 || num == INT64_MIN || den == INT64_MIN) return std::nullopt;
  if (den < 0) {
    num = -num;
    den = -den;
  }
  int64_t g = std::gcd(num < 0 ? -num : num, den);
  if (g == 0) g = 1;
  return Rational{num / g, den / g};
}

std::optional<Rational> add(const Rational& a, const Rational& b) {
  auto x = checked_mul(a.num, b.den), y = checked_mul(b.num, a.den), d = checked_mul(a.den, b.den);
  if (!x || !y || !d) return std::nullopt;
  auto n = checked_add(*x, *y);
  if (!n) return std::nullopt;
  return make_rational(*n, *d);
}

std::optional<Rational> sub(const Rational& a, const Rational& b) {
  if (b.num == INT64_MIN) return std::nullopt;
  return add(a, Rational{-b.num, b.den});
}

std::optional<Rational> mul(const Rational& a, const Rational& b) {
  auto n = checked_mul(a.num, b.num), d = checked_mul(a.den, b.den);
  if (!n || !d) return std::nullopt;
  return make_rational(*n, *d);
}

std::optional<Rational> div(const Rational& a, const Rational& b) {
  if (b.num == 0) return std::nullopt;
  auto n = checked_mul(a.num, b.den), d = checked_mul(a.den, b.num);
  if (!n || !d) return std::nullopt;
  return make_rational(*n, *d);
}

std::optional<Rational> parse_rational(const std::string& text) {
  std::string s;
  for (char c : text)
    if (c != ',' && c != ' ') s += c;
  if (s.empty()) return std::nullopt;
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    s = s.substr(1);
  }
  std::optional<Rational> r;
  if (size_t slash = s.find('/'); slash != std::string::npos) {
    auto n = parse_digits(s.substr(0, slash)), d = parse_digits(s.substr(slash + 1));
    if (!n || !d) return std::nullopt;
    r = make_rational(*n, *d);
  } else {
    size_t dot = s.find('.');
    std::string whole = dot == std::string::npos ? s : s.substr(0, dot);
    std::string frac = dot == std::string::npos ? "" : s.substr(dot + 1);
    if (whole.empty() && frac.empty()) return std::nullopt;
    auto w = whole.empty() ? std::optional<int64_t>(0) : parse_digits(whole);
    auto f = frac.empty() ? std::optional<int64_t>(0) : parse_digits(frac);
    if (!w || !f || frac.size() > 17) return std::nullopt;
    int64_t scale = 1;
    for (size_t i = 0; i < frac.size(); ++i) scale *= 10;
    auto whole_scaled = checked_mul(*w, scale);
    if (!whole_scaled) return std::nullopt;
    auto n = checked_add(*whole_scaled, *f);
    if (!n) return std::nullopt;
    r = make_rational(*n, scale);
  }
  if (r && negative) r->num = -r->num;
  return r;
}

}  // namespace slimpi
