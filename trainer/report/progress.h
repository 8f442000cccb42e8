// defines: Progress — rank 0's status line during an epoch: a bar redrawn in place on a
// terminal, plain lines (every log_every steps) anywhere else, such as a pipe to partrain run.
#pragma once

#include <string>

namespace partrain {

class Progress {
 public:
  explicit Progress(bool enabled);
  bool on_terminal() const { return terminal_; }
  // fraction: how much of the epoch is done, drawn as a bar on a terminal; force_line: print
  // it as a line of its own off a terminal too.
  void update(const std::string& line, double fraction, bool force_line);
  void finish(const std::string& line);  // the epoch's closing line, always printed

 private:
  bool enabled_;
  bool terminal_;
};

}  // namespace partrain
