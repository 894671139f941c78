#include "archspace/train/run_tokenizer.h"

#include <filesystem>

#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;

RunTokenizer shard_tokenizer(const std::string& shard_dir, const ShardManifest& manifest) {
  const std::string file = (fs::path(shard_dir) / "tokenizer.json").string();
  if (fs::exists(file)) {
    const std::string digest = sha256_file(file);
    if (digest != manifest.tokenizer_sha256) {
      throw Error(file + ": SHA-256 " + digest + " does not match the tokenizer_sha256 of " + shard_dir +
                  "/manifest.json (" + manifest.tokenizer_sha256 +
                  "): the shards were tokenized with another tokenizer");
    }
    return {file, ""};
  }
  const std::string none = "checkpoints will carry no tokenizer: " + shard_dir + " has no tokenizer.json";
  if (manifest.tokenizer_name != "allenai/dolma2")
    return {"", none + " (tokenized with " + manifest.tokenizer_name + ")"};
  std::shared_ptr<const Tokenizer> dolma2;
  try {
    dolma2 = Tokenizer::load("dolma2");
  } catch (const Error& e) {
    return {"", none + " and the dolma2 tokenizer is not installed (" + e.what() + ")"};
  }
  if (dolma2->sha256() != manifest.tokenizer_sha256) {
    return {"", none + " and the installed dolma2 file (" + dolma2->path() +
                    ") differs from the one the shards were tokenized with"};
  }
  return {dolma2->path(), ""};
}

}  // namespace archspace
