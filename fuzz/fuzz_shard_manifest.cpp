// libFuzzer target: token shard manifests (TokenShards::open on a directory whose manifest.json is the
// input). The directory also holds part-00000.npy (4 tokens), so manifests that name it get mapped and read.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "archspace/data/token_shards.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const uint32_t tokens[4] = {1, 2, 3, 100257};
  fuzz::write_file("part-00000.npy", reinterpret_cast<const uint8_t*>(tokens), sizeof(tokens));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::write_file("manifest.json", data, size);
  try {
    auto shards = archspace::TokenShards::open(fuzz::scratch_dir());
    uint64_t total = 0;
    for (size_t s = 0; s < shards->num_shards(); ++s) total += shards->shard_tokens(s);
    if (total <= 1024) (void)shards->read_all();
    shards->verify();
  } catch (const archspace::Error&) {
  }
  return 0;
}
