// Rational — exact fractions for the math and countdown verifiers: numerator and
// denominator in 64 bits, always reduced, denominator > 0. Arithmetic that would
// overflow, and division by zero, return nullopt instead of a wrong value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace slimpi {

struct Rational {
  int64_t num = 0;
  int64_t den = 1;
  bool operator==(const Rational& o) const { return num == o.num && den == o.den; }
};

std::optional<Rational> make_rational(int64_t num, int64_t den);
std::optional<Rational> add(const Rational& a, const Rational& b);
std::optional<Rational> sub(const Rational& a, const Rational& b);
std::optional<Rational> mul(const Rational& a, const Rational& b);
std::optional<Rational> div(const Rational& a, const Rational& b);
// "42", "-3", "0.5", ".50", "1/2", "1,000" -> the exact value; anything else nullopt.
std::optional<Rational> parse_rational(const std::string& text);

}  // namespace slimpi
