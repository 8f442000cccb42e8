#include "common/cpu_list.h"

#include <cstddef>

#if defined(__linux__)
#include <sched.h>

#include <cerrno>
#endif

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

std::vector<int> affinity_of(int tid) {
  std::vector<int> allowed;
#if defined(__linux__)
  // The kernel refuses (EINVAL) a set smaller than its own CPU count: try larger ones, up to
  // 65536 CPUs (seven tries).
  for (int cpus = 1024; cpus <= 65536; cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return {};
    const std::size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    const int rc = ::sched_getaffinity(tid, size, set);
    const int error = errno;
    if (rc == 0) {
      for (int cpu = 0; cpu < cpus; ++cpu) {
        if (CPU_ISSET_S(cpu, size, set) != 0) allowed.push_back(cpu);
      }
    }
    CPU_FREE(set);
    if (rc == 0 || error != EINVAL) return allowed;
  }
#else
  (void)tid;
#endif
  return allowed;
}

}  // namespace partrain
