// archspace encode: text to token ids, or ids back to text, with a tokenizer (what the model sees).
#include <iostream>

#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct EncodeArgs {
  std::string tokenizer = "dolma2", text, file, ids;
};

int run(const EncodeArgs& a) {
  auto tok = Tokenizer::load(a.tokenizer);
  if (!a.ids.empty()) {
    std::vector<uint32_t> ids;
    for (int64_t id : parse_token_ids(a.ids, tok->vocab_size(), "--ids")) ids.push_back(static_cast<uint32_t>(id));
    std::cout << tok->decode(ids);
    return 0;
  }
  std::vector<uint32_t> ids;
  if (!a.file.empty()) {
    ids = encode_text_file(*tok, a.file);
  } else {
    try {
      ids = tok->encode(a.text);
    } catch (const Error& e) {
      throw Error(std::string("--text: ") + e.what());
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<EncodeArgs>();
  auto* app = parent.add_subcommand("encode", "Encode text to token ids (or --ids to decode) with a tokenizer");
  app->add_option("--tokenizer", a->tokenizer, "tokenizer.json, a directory holding one, or dolma2")->capture_default_str();
  auto* text = app->add_option("--text", a->text, "text to encode");
  auto* file = app->add_option("--file", a->file, "file to encode");
  auto* ids = app->add_option("--ids", a->ids, "token ids to decode instead");
  text->excludes(file)->excludes(ids);
  file->excludes(ids);
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(40, add);
}  // namespace archspace::cli
