// libFuzzer target: the safetensors header parser (SafetensorsFile::open) and reading every tensor it lists.
#include <cstddef>
#include <cstdint>

#include "archspace/io/safetensors.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("model.safetensors", data, size);
  try {
    auto file = archspace::SafetensorsFile::open(path);
    for (const auto& info : file->tensors()) {
      at::Tensor t = file->tensor(info.name);
      if (t.numel() > 0 && t.numel() < (1 << 16)) (void)t.sum();
    }
  } catch (const archspace::Error&) {
  }
  return 0;
}
