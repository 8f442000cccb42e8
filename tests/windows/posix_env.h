// defines: setenv(), unsetenv() for MinGW, whose C runtime has only _putenv_s.
//
// Force-included (-include) into test sources that set variables the POSIX way; the product
// code reads the environment with std::getenv only.
#pragma once

#include <cstdlib>

#ifdef _WIN32
inline int setenv(const char* name, const char* value, int overwrite) {
  if (!overwrite && std::getenv(name) != nullptr) return 0;
  return _putenv_s(name, value);
}
// An empty value removes the variable from a Windows environment.
inline int unsetenv(const char* name) { return _putenv_s(name, ""); }
#endif
