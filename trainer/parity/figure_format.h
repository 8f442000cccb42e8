// defines: fixed(), format_figure() and within_words() — the wording of numbers and verdicts
// shared by the parity table and chart, so that both say the same thing the same way.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace partrain::parity {

inline std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Seconds and images/s keep the digits that mean something at their size; ratios three
// decimals, as the reference states its derived figures.
inline std::string format_figure(double value, const std::string& unit) {
  if (unit == "s") return fixed(value, value < 10.0 ? 3 : 2);
  if (unit == "img/s") return fixed(value, value < 100.0 ? 1 : 0);
  return fixed(value, 3);
}

// "all 3 checked figures within tolerance", in words that also fit one or none.
inline std::string within_words(int checked) {
  if (checked == 0) return "no figure checked: the reference file sets no tolerance";
  if (checked == 1) return "the 1 checked figure is within tolerance";
  return "all " + std::to_string(checked) + " checked figures within tolerance";
}

}  // namespace partrain::parity
