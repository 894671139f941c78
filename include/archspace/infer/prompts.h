// Prompts for generation as users give them: text, token ids, a chat (messages), or a JSON Lines file
// of any of these; and the stop tokens that end a completion. The CLI only gathers the arguments.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

struct Prompts {
  std::vector<std::vector<uint32_t>> ids;  // one per prompt, in order
  bool chat = false;                       // formatted as a chat: the assistant's turn ends at <|im_end|>
};

// The conversation so far (`messages`: a list of {role, content}, an object with "messages", or null),
// then `user_text` as a user turn when not empty, as a generation prompt (SPEC.md section 6).
std::vector<uint32_t> chat_prompt(const Tokenizer& tokenizer, nlohmann::json messages, const std::string& user_text,
                                  const std::string& where);

// JSON Lines, one prompt per line: a string, or {"prompt": "..."}, {"tokens": [ids]} or {"messages": [...]}
// (a chat, whatever `as_chat` says). Text prompts are formatted as chats when `as_chat`. Errors name
// "PATH:LINE".
Prompts read_prompts_file(const std::string& path, const Tokenizer& tokenizer, bool as_chat, int64_t vocab_size);

// Token ids that end a completion: <|endoftext|>, the model's eos_token_id, and <|im_end|> for chats.
std::vector<uint32_t> stop_token_ids(const Tokenizer& tokenizer, const ModelConfig& config, bool chat);

}  // namespace archspace
