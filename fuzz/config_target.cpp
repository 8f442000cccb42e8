// The config loader: any text is either a valid Config or one UsageError; a Config that
// loads also survives its own printout (what `partrain validate` shows loads back the same).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "fuzz/scratch_file.h"
#include "trainer/config/config.h"

namespace partrain::fuzz {

void fuzz_config(const std::uint8_t* data, std::size_t size) {
  const Config config = load_config(write_scratch_file("config.yaml", data, size));
  const std::string printed = config_to_yaml(config);
  const std::string json = config_to_json(config);
  const Config again = load_config(write_scratch_file(
      "printed.yaml", reinterpret_cast<const std::uint8_t*>(printed.data()), printed.size()));
  if (config_to_yaml(again) != printed) {
    throw InvariantBroken("config printed as\n" + printed + "loads back as\n" +
                          config_to_yaml(again));
  }
}

}  // namespace partrain::fuzz
