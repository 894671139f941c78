// libFuzzer target: Megatron-Core .idx files (parse_megatron_index on the input's bytes, then the whole
// reader on PREFIX.idx = the input with a .bin of the size it describes, when that is small).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "archspace/data/megatron_dataset.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const archspace::MegatronIndex idx = archspace::parse_megatron_index(data, size, "fuzz.idx");
    const uint64_t bytes = idx.tokens * archspace::token_dtype_bytes(idx.dtype);
    if (bytes > (1 << 16)) return 0;
    std::vector<uint8_t> bin(bytes);
    for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i * 7);
    fuzz::write_file("d.idx", data, size);
    fuzz::write_file("d.bin", bin.data(), bin.size());
    auto shards = archspace::open_megatron_dataset(fuzz::scratch_dir() + "/d", 300, 0);
    (void)shards->read_all();
    shards->verify();
  } catch (const archspace::Error&) {
  }
  return 0;
}
