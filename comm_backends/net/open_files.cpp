#include "comm_backends/net/open_files.h"

#ifndef _WIN32
#include <sys/resource.h>
#endif

namespace partrain::comm::net {

OpenFileLimit open_file_limit() {
  OpenFileLimit limit;
#ifndef _WIN32
  rlimit now{};
  if (getrlimit(RLIMIT_NOFILE, &now) != 0) return limit;
  limit.soft = now.rlim_cur;
  limit.hard = now.rlim_max;
  limit.known = true;
#endif
  return limit;
}

OpenFileLimit raise_open_file_limit() {
#ifndef _WIN32
  rlimit now{};
  if (getrlimit(RLIMIT_NOFILE, &now) == 0 && now.rlim_cur < now.rlim_max) {
    rlimit raised = now;
    raised.rlim_cur = now.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);  // refused (a hard limit above the kernel's): keep soft
  }
#endif
  return open_file_limit();
}

}  // namespace partrain::comm::net
