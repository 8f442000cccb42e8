// defines: cpu_list() and cpus_of() — CPU ids written and read in the kernel's list form
// ("0-3,8,10-11"), as cpu_affinity() (comm_backends/shm/host_identity.h), the rank bindings and
// the launcher's lines write them — and affinity_of(), the CPUs a thread may run on.
#pragma once

#include <string>
#include <vector>

namespace partrain {

// `cpus` (ascending, without repeats) as ranges: {0, 1, 2, 3, 8} -> "0-3,8".
std::string cpu_list(const std::vector<int>& cpus);

// The CPUs of such a list, ascending, without repeats; empty if it is not one or names an id
// from 65536 on.
std::vector<int> cpus_of(const std::string& list);

// The CPUs thread `tid` may run on (0: the calling thread; a process id names its main
// thread), ascending; empty where the system does not say (not Linux).
std::vector<int> affinity_of(int tid);

}  // namespace partrain
