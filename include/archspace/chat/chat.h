// The chat format of the stage-4 (SFT) models, SPEC.md section 6: ChatML-style turns
// "<|im_start|>{role}\n{content}<|im_end|>\n", the last assistant turn ending in <|endoftext|>, a default
// system turn when none is given. For training, only assistant content and its terminator carry loss.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

extern const char* const kDefaultSystemPrompt;

struct ChatExample {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> trained;  // 1 where the token is a training target (assistant content + end)
};

// messages: [{"role": "system"|"user"|"assistant"|"environment", "content": "..."}...].
// `where` names the source in errors.
ChatExample encode_chat(const Tokenizer& tokenizer, const nlohmann::json& messages, const std::string& where);

// A generation prompt: the conversation so far (default system turn if none), then
// "<|im_start|>assistant\n" for the model to continue; as text (the chat template's, add_generation_prompt=True)
// and as ids (that text encoded, the special tokens recognised).
std::string chat_prompt_text(const nlohmann::json& messages, const std::string& where);
std::vector<uint32_t> encode_chat_prompt(const Tokenizer& tokenizer, const nlohmann::json& messages,
                                         const std::string& where);

// One JSON object per line with a "messages" list.
std::vector<ChatExample> load_chat_jsonl(const std::string& path, const Tokenizer& tokenizer);

}  // namespace archspace
