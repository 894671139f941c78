#include "archspace/infer/prompts.h"

#include "archspace/chat/chat.h"
#include "archspace/util/error.h"
#include "archspace/util/json_lines.h"

namespace archspace {

std::vector<uint32_t> chat_prompt(const Tokenizer& tokenizer, nlohmann::json messages, const std::string& user_text,
                                  const std::string& where) {
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
  if (messages.is_null()) messages = nlohmann::json::array();
  if (!user_text.empty()) messages.push_back({{"role", "user"}, {"content", user_text}});
  return encode_chat_prompt(tokenizer, messages, where);
}

Prompts read_prompts_file(const std::string& path, const Tokenizer& tokenizer, bool as_chat, int64_t vocab_size) {
  Prompts prompts;
  prompts.chat = as_chat;
  for_each_json_line(path, [&](const nlohmann::json& value, const std::string& where) {
    const nlohmann::json j = value.is_string() ? nlohmann::json{{"prompt", value}} : value;
    if (!j.is_object())
      throw Error(where + ": expected a string or an object with \"prompt\", \"tokens\" or \"messages\"");
    if (j.contains("tokens")) {
      if (!j["tokens"].is_array()) throw Error(where + ": \"tokens\" must be a list of ids");
      std::vector<uint32_t> ids;
      for (const auto& id : j["tokens"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          throw Error(where + ": token id " + id.dump() + " is out of range [0, " + std::to_string(vocab_size) + ")");
        }
        ids.push_back(id.get<uint32_t>());
      }
      prompts.ids.push_back(std::move(ids));
    } else if (j.contains("messages")) {
      prompts.ids.push_back(chat_prompt(tokenizer, j["messages"], "", where));
      prompts.chat = true;
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      const std::string text = j["prompt"].get<std::string>();
      if (text.empty()) throw Error(where + ": empty prompt");
      prompts.ids.push_back(as_chat ? chat_prompt(tokenizer, nullptr, text, where) : tokenizer.encode(text));
    } else {
      throw Error(where + ": expected a string or an object with \"prompt\", \"tokens\" or \"messages\"");
    }
  });
  if (prompts.ids.empty()) throw Error(path + ": no prompts");
  return prompts;
}

std::vector<uint32_t> stop_token_ids(const Tokenizer& tokenizer, const ModelConfig& config, bool chat) {
  std::vector<uint32_t> ids;
  if (chat) {
    if (auto end = tokenizer.token_to_id("<|im_end|>")) ids.push_back(*end);
  }
  if (auto eos = tokenizer.token_to_id("<|endoftext|>")) ids.push_back(*eos);
  if (config.eos_token_id) ids.push_back(static_cast<uint32_t>(*config.eos_token_id));
  return ids;
}

}  // namespace archspace
