#include "common/cpu_list.h"

#include <cstddef>

namespace partrain {

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    std::size_t last = i;
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (last > i) out += '-' + std::to_string(cpus[last]);
    i = last;
  }
  return out;
}

std::vector<int> cpus_of(const std::string& list) {
  // CPU ids as cpu_affinity() can write them: below 65536.
  constexpr std::size_t kCpuLimit = 65536;
  std::vector<bool> seen;
  std::size_t at = 0;
  // A CPU id at `at`, or kCpuLimit where there is none or it is too large.
  const auto number = [&] {
    const std::size_t from = at;
    std::size_t value = 0;
    while (at < list.size() && list[at] >= '0' && list[at] <= '9' && at - from < 6) {
      value = value * 10 + static_cast<std::size_t>(list[at++] - '0');
    }
    return at == from ? kCpuLimit : value;
  };
  // One range ("3" or "0-7") per turn; each turn consumes at least one character.
  while (at < list.size()) {
    const std::size_t first = number();
    const std::size_t last = at < list.size() && list[at] == '-' ? (++at, number()) : first;
    if (first > last || last >= kCpuLimit || (at < list.size() && list[at++] != ',')) return {};
    if (seen.size() <= last) seen.resize(last + 1);
    for (std::size_t cpu = first; cpu <= last; ++cpu) seen[cpu] = true;
  }
  std::vector<int> cpus;
  for (std::size_t cpu = 0; cpu < seen.size(); ++cpu) {
    if (seen[cpu]) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

}  // namespace partrain
