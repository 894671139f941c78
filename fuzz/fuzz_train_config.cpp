// libFuzzer target: TOML run configs (TrainConfig::load). The scratch directory holds data/corpus/train and
// data/corpus/valid (empty directories) and is the working directory, so the seeds' data paths exist.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "archspace/config/train_config.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::filesystem::create_directories(fuzz::scratch_dir() + "/data/corpus/train");
  std::filesystem::create_directories(fuzz::scratch_dir() + "/data/corpus/valid");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("run.toml", data, size);
  const std::string cwd = std::filesystem::current_path();
  if (chdir(fuzz::scratch_dir().c_str()) != 0) __builtin_trap();
  try {
    archspace::TrainConfig config = archspace::TrainConfig::load(path);
    (void)config.model();
  } catch (const archspace::Error&) {
  }
  if (chdir(cwd.c_str()) != 0) __builtin_trap();
  return 0;
}
