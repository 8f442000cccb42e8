// defines: partrain::Error and its kinds (UsageError, PeerError, CommError), PARTRAIN_CHECK.
//
// The kinds exist because callers act differently on them:
//   UsageError  bad command line, config or input data      -> exit 2, one line
//   PeerError   a named peer rank died, closed or timed out -> exit 1, name the rank
//   CommError   any other failure of a collective or store  -> exit 1
// A bug is an assert, not one of these.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace partrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class PeerError : public CommError {
 public:
  PeerError(int peer_rank, const std::string& what) : CommError(what), peer_rank_(peer_rank) {}
  int peer_rank() const { return peer_rank_; }

 private:
  int peer_rank_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace partrain

// PARTRAIN_CHECK(cond, ErrorType, message parts...): throws ErrorType(message) when cond is
// false. The message is for the user, so it says what is wrong, not where in our code.
#define PARTRAIN_CHECK(cond, ErrorType, ...)                               \
  do {                                                                     \
    if (!(cond)) throw ErrorType(::partrain::detail::concat(__VA_ARGS__)); \
  } while (0)
