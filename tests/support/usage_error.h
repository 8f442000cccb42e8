// defines: usage_error_of() — runs a statement that must throw UsageError and returns what it
// says, for tests that check a reader's or parser's message.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "common/errors.h"

namespace partrain::testing {

// Runs `statement`, expects a UsageError, and returns its message ("" if none was thrown).
template <typename F>
std::string usage_error_of(F&& statement) {
  try {
    statement();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UsageError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected UsageError, nothing was thrown";
  return "";
}

}  // namespace partrain::testing
