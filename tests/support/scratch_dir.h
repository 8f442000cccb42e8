// defines: ScratchDir — a test's own directory under the system temp directory, removed with
// everything in it when the test ends (common/temp_dir.h's TempDir), with what tests do with
// one: name a file in it, write a text file, open a file store in it.
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>

#include "common/temp_dir.h"

namespace partrain::testing {

class ScratchDir : public TempDir {
 public:
  // `stem` starts the directory's name, to tell whose it is when one is left behind.
  explicit ScratchDir(const std::string& stem = "partrain-test") : TempDir(stem) {}

  // The path of `name` in here, as text: dir / "report.json".
  std::string operator/(const std::string& name) const { return (path() / name).string(); }

  // Writes `text` to the file `name` in here and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = *this / name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + file);
    return file;
  }

  // A file store in here, for ranks of a test to meet in.
  std::string url() const { return "file://" + string(); }
};

}  // namespace partrain::testing
