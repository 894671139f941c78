// archspace encode: text to token ids, or ids back to text, with a tokenizer (what the model sees).
#include <iostream>

#include "archspace/chat/chat.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct EncodeArgs {
  std::string tokenizer = "dolma2", text, file, ids, messages;
  bool generation_prompt = false;
};

void print_ids(const std::vector<uint32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
}

int run(const EncodeArgs& a) {
  auto tok = Tokenizer::load(a.tokenizer);
  if (!a.ids.empty()) {
    std::vector<uint32_t> ids;
    for (int64_t id : parse_token_ids(a.ids, tok->vocab_size(), "--ids")) ids.push_back(static_cast<uint32_t>(id));
    std::cout << tok->decode(ids);
    return 0;
  }
  if (!a.messages.empty()) {
    // The engine's chat encodings (SPEC.md section 6), for comparing with a chat template.
    const nlohmann::json messages = read_json_file(a.messages);
    print_ids(a.generation_prompt ? encode_chat_prompt(*tok, messages, a.messages)
                                  : encode_chat(*tok, messages, a.messages).ids);
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
  print_ids(ids);
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<EncodeArgs>();
  auto* app = parent.add_subcommand(
      "encode", "Encode text (or a chat: --messages) to token ids, or --ids back to text, with a tokenizer");
  app->add_option("--tokenizer", a->tokenizer, "tokenizer.json, a directory holding one, or dolma2")
      ->capture_default_str();
  auto* text = app->add_option("--text", a->text, "text to encode");
  auto* file = app->add_option("--file", a->file, "file to encode");
  auto* ids = app->add_option("--ids", a->ids, "token ids to decode instead");
  auto* messages =
      app->add_option("--messages", a->messages,
                      "a JSON list of chat messages: print the SFT encoding (or, with --generation-prompt, the prompt "
                      "encoding generate uses)");
  app->add_flag("--generation-prompt", a->generation_prompt, "with --messages: end with the assistant's turn header")
      ->needs(messages);
  text->excludes(file)->excludes(ids)->excludes(messages);
  file->excludes(ids)->excludes(messages);
  ids->excludes(messages);
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(40, add);
}  // namespace archspace::cli
