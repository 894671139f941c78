#include "archspace/chat/chat.h"

#include "archspace/util/error.h"
#include "archspace/util/json_lines.h"

namespace archspace {

const char* const kDefaultSystemPrompt =
    "You are a helpful function-calling AI assistant. You do not currently have access to any functions. "
    "<functions></functions>";

namespace {
// Checks one message's shape and role; returns the role.
std::string checked_role(const nlohmann::json& m, size_t i, const std::string& where) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
      !m["content"].is_string()) {
    throw Error(where + ": message " + std::to_string(i) + " needs string 'role' and 'content'");
  }
  const std::string role = m["role"];
  if (role != "system" && role != "user" && role != "assistant" && role != "environment") {
    throw Error(where + ": message " + std::to_string(i) + " has role '" + role +
                "' (system, user, assistant, environment)");
  }
  return role;
}
}  // namespace

ChatExample encode_chat(const Tokenizer& tokenizer, const nlohmann::json& messages, const std::string& where) {
  if (!messages.is_array() || messages.empty()) throw Error(where + ": 'messages' must be a non-empty list");
  ChatExample ex;
  // Each turn is encoded as one text, exactly as the chat template renders it (a content that starts
  // with a newline merges with the header's newline into one token there). Special tokens bound the
  // turns, so turn by turn equals the whole conversation at once. A token is trained when it carries a
  // byte of a trained span: the assistant's content and its end token.
  auto append = [&](const std::string& untrained_head, const std::string& body, bool trained) {
    size_t end = 0;
    for (uint32_t id : tokenizer.encode(untrained_head + body)) {
      end += tokenizer.id_to_token(id).size();
      ex.ids.push_back(id);
      ex.trained.push_back(trained && end > untrained_head.size());
    }
  };
  size_t last_assistant = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (checked_role(messages[i], i, where) == "assistant") last_assistant = i;
  }
  if (last_assistant == messages.size()) throw Error(where + ": no assistant message to learn from");
  if (messages[0]["role"] != "system")
    append(std::string("<|im_start|>system\n") + kDefaultSystemPrompt + "<|im_end|>\n", "", false);
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string role = messages[i]["role"], content = messages[i]["content"];
    const std::string head = "<|im_start|>" + role + "\n";
    if (i == last_assistant) {
      append(head, content + "<|endoftext|>", true);
      break;  // nothing after the final assistant turn is trained on or needed
    }
    append(head, content + "<|im_end|>", role == "assistant");
    append("\n", "", false);
  }
  return ex;
}

std::string chat_prompt_text(const nlohmann::json& messages, const std::string& where) {
  if (!messages.is_array() || messages.empty())
    throw Error(where + ": the conversation must be a non-empty list of messages");
  std::string text;
  const nlohmann::json& first = messages[0];
  if (!first.is_object() || !first.contains("role") || first["role"] != "system") {
    text += std::string("<|im_start|>system\n") + kDefaultSystemPrompt + "<|im_end|>\n";
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    text += "<|im_start|>" + checked_role(messages[i], i, where) + "\n" + messages[i]["content"].get<std::string>() +
            "<|im_end|>\n";
  }
  return text + "<|im_start|>assistant\n";
}

std::vector<uint32_t> encode_chat_prompt(const Tokenizer& tokenizer, const nlohmann::json& messages,
                                         const std::string& where) {
  return tokenizer.encode(chat_prompt_text(messages, where));
}

std::vector<ChatExample> load_chat_jsonl(const std::string& path, const Tokenizer& tokenizer) {
  std::vector<ChatExample> out;
  for_each_json_line(path, [&](const nlohmann::json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("messages")) throw Error(where + ": no 'messages' field");
    out.push_back(encode_chat(tokenizer, j["messages"], where));
  });
  if (out.empty()) throw Error(path + ": no chat examples");
  return out;
}

}  // namespace archspace
