#include "common/temp_dir.h"

#include <random>
#include <sstream>
#include <system_error>

#include "common/errors.h"

namespace partrain {

TempDir::TempDir(const std::string& stem, const std::filesystem::path& parent) {
  namespace fs = std::filesystem;
  std::random_device random;
  constexpr int kAttempts = 16;  // a clash of 64 random bits twice in a row is not chance
  std::error_code ec;
  for (int attempt = 0; attempt < kAttempts && path_.empty(); ++attempt) {
    std::ostringstream name;
    name << stem << "-" << std::hex << random() << random();
    if (fs::create_directory(parent / name.str(), ec)) path_ = parent / name.str();
  }
  PARTRAIN_CHECK(!path_.empty(), Error, "cannot make a temporary directory under ", parent.string(),
                 ec ? ": " + ec.message() : std::string());
  fs::permissions(path_, fs::perms::owner_all, fs::perm_options::replace, ec);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace partrain
