#include "archspace/train/run_tokenizer.h"

#include <filesystem>

#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {
RunTokenizer tokenizer_of(const std::string& where, const std::string& manifest_name, const std::string& file,
                          const ShardManifest& manifest) {
  if (fs::exists(file)) {
    const std::string digest = sha256_file(file);
    if (digest != manifest.tokenizer_sha256) {
      throw Error(file + ": SHA-256 " + digest + " does not match the tokenizer_sha256 of " + manifest_name + " (" +
                  manifest.tokenizer_sha256 + "): the shards were tokenized with another tokenizer");
    }
    return {file, ""};
  }
  const std::string none =
      "checkpoints will carry no tokenizer: " + where + " has no " + fs::path(file).filename().string();
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
}  // namespace

RunTokenizer shard_tokenizer(const std::string& shard_dir, const ShardManifest& manifest) {
  return tokenizer_of(shard_dir, shard_dir + "/manifest.json", (fs::path(shard_dir) / "tokenizer.json").string(),
                      manifest);
}

RunTokenizer source_tokenizer(const TokenShards& source) {
  return tokenizer_of(source.dir(), "the manifest of " + source.dir(), source.tokenizer_file(), source.manifest());
}

}  // namespace archspace
