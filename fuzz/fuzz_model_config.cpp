// libFuzzer target: config.json (ModelConfig::load), then a round trip through to_json/from_json.
#include <cstddef>
#include <cstdint>

#include "archspace/config/model_config.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("config.json", data, size);
  try {
    archspace::ModelConfig config = archspace::ModelConfig::load(path);
    // What load accepted must survive its own serialisation.
    archspace::ModelConfig again = archspace::ModelConfig::from_json(config.to_json(), "round trip");
    if (again.to_json() != config.to_json()) __builtin_trap();
  } catch (const archspace::Error&) {
  }
  return 0;
}
