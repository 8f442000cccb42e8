// defines: partrain::Error and its kinds (UsageError, PeerError, CommError), the check
// macros PARTRAIN_CHECK and PARTRAIN_CHECK_EQ/_NE/_LT/_LE/_GT/_GE.
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
  // Where in partrain's source the error was raised ("ring_allreduce.cpp:212"), when a check
  // macro raised it; empty otherwise. Kept apart from what(): the message is for the user,
  // this is for a bug report (printed with PARTRAIN_DEBUG=1, see cli/main.cpp).
  const std::string& source() const { return source_; }
  void set_source(std::string source) { source_ = std::move(source); }

 private:
  std::string source_;
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

// How a PeerError's message ends where the rank lost went on an error of its own, which it says
// itself (in its output, and through the store: comm::why_rank_stopped()). A caller that has
// that reason puts it in place of these words.
inline constexpr const char* kItsOwnOutputSaysWhy = " (its own output says why)";

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// "ring_allreduce.cpp:212": the file name without its folders, which say nothing new.
inline std::string source_location(const char* file, int line) {
  std::string path(file);
  const auto slash = path.find_last_of("/\\");
  return (slash == std::string::npos ? path : path.substr(slash + 1)) + ":" + std::to_string(line);
}

template <typename ErrorType>
[[noreturn]] void raise(const char* file, int line, const std::string& message) {
  ErrorType error(message);
  error.set_source(source_location(file, line));
  throw error;
}

// The tail the comparison macros add: " (got 3, expected <= 2)".
template <typename A, typename B>
std::string comparison(const A& actual, const char* relation, const B& bound) {
  return concat(" (got ", actual, ", expected ", relation, " ", bound, ")");
}

}  // namespace detail

}  // namespace partrain

// PARTRAIN_CHECK(cond, ErrorType, message parts...): throws ErrorType(message) when cond is
// false, recording file:line in Error::source(). The message is for the user, so it says
// what is wrong in their terms, not where in our code.
#define PARTRAIN_CHECK(cond, ErrorType, ...)                                         \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      ::partrain::detail::raise<ErrorType>(__FILE__, __LINE__,                       \
                                           ::partrain::detail::concat(__VA_ARGS__)); \
    }                                                                                \
  } while (0)

// PARTRAIN_CHECK_LT(a, b, ErrorType, message parts...): as PARTRAIN_CHECK(a < b, ...), with
// " (got A, expected < B)" appended, so call sites do not format the values by hand. Each
// operand is evaluated once.
#define PARTRAIN_CHECK_OP_(a, op, b, ErrorType, ...)                                      \
  do {                                                                                    \
    const auto& partrain_check_a_ = (a);                                                  \
    const auto& partrain_check_b_ = (b);                                                  \
    if (!(partrain_check_a_ op partrain_check_b_)) {                                      \
      ::partrain::detail::raise<ErrorType>(                                               \
          __FILE__, __LINE__,                                                             \
          ::partrain::detail::concat(__VA_ARGS__) +                                       \
              ::partrain::detail::comparison(partrain_check_a_, #op, partrain_check_b_)); \
    }                                                                                     \
  } while (0)

#define PARTRAIN_CHECK_EQ(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, ==, b, ErrorType, __VA_ARGS__)
#define PARTRAIN_CHECK_NE(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, !=, b, ErrorType, __VA_ARGS__)
#define PARTRAIN_CHECK_LT(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, <, b, ErrorType, __VA_ARGS__)
#define PARTRAIN_CHECK_LE(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, <=, b, ErrorType, __VA_ARGS__)
#define PARTRAIN_CHECK_GT(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, >, b, ErrorType, __VA_ARGS__)
#define PARTRAIN_CHECK_GE(a, b, ErrorType, ...) PARTRAIN_CHECK_OP_(a, >=, b, ErrorType, __VA_ARGS__)
