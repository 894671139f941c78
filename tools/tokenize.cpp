// archspace tokenize: text and JSON Lines documents to token shards with a manifest.
#include "archspace/data/tokenize.h"

#include <iostream>

#include "command.h"

namespace archspace::cli {
namespace {

struct TokenizeArgs {
  TokenizeOptions options;
  std::string invalid_utf8 = "error";
  std::string format = "shards";
};

int run(TokenizeArgs a) {
  a.options.invalid_utf8 = a.invalid_utf8 == "replace" ? InvalidUtf8Policy::kReplace : InvalidUtf8Policy::kError;
  a.options.format = parse_token_format(a.format, "--format");
  const ShardManifest m = tokenize_to_shards(a.options);
  std::cerr << "wrote " << m.total_tokens() << " tokens of " << m.total_documents() << " documents in "
            << m.shards.size() << " file(s) to " << a.options.out_dir << " (" << a.format << ", "
            << token_dtype_name(m.dtype) << ", tokenizer " << m.tokenizer_name << ")\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<TokenizeArgs>();
  TokenizeOptions& o = a->options;
  auto* app =
      parent.add_subcommand("tokenize", "Text/JSONL to token shards (uint32, EOS after each document) + manifest.json");
  app->add_option("--tokenizer", o.tokenizer, "tokenizer.json, a directory holding one, or dolma2")
      ->capture_default_str();
  app->add_option("--out", o.out_dir,
                  "output directory (must not hold shards yet); for --format megatron the prefix DIR/NAME")
      ->required();
  app->add_option("--format", a->format,
                  "shards: uint32 + manifest.json; megatron: NAME.bin + NAME.idx; olmo-core: .npy + .csv.gz")
      ->check(CLI::IsMember({"shards", "megatron", "olmo-core"}))
      ->capture_default_str();
  app->add_option("INPUT", o.inputs, "text files (one document each), *.jsonl (one per line), or directories")
      ->required();
  app->add_option("--threads", o.threads, "encoding threads (default: all cores)")->check(CLI::Range(1, 1024));
  app->add_option("--shard-tokens", o.shard_tokens, "tokens per shard file (megatron: one .bin)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--invalid-utf8", a->invalid_utf8, "error: stop, naming file and byte; replace: U+FFFD, counted")
      ->check(CLI::IsMember({"error", "replace"}))
      ->capture_default_str();
  app->add_option("--text-field", o.text_field, "JSONL field holding the text")->capture_default_str();
  app->add_flag("--verify-roundtrip", o.verify_roundtrip, "check decode(encode(doc)) == doc for every document");
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(50, add);
}  // namespace archspace::cli
