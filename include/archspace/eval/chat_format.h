// Chat-format evaluation of SFT/instruct models (`eval downstream --chat`): OLMES' use_chat_format, lm-eval's
// --apply_chat_template --fewshot_as_multiturn. A request's context becomes a conversation rendered by the
// model's chat template with the generation prompt (chat/chat.h, equal to the exported tokenizer's
// apply_chat_template(..., add_generation_prompt=True)), followed by an assistant prefix if the request has one.
//
// Where the conversation comes from:
//   - a chat-format request file (OLMES with use_chat_format writes request.context as {"messages": [{"role",
//     "content"}...], "assistant_prefix": "..."}): as it is;
//   - a plain few-shot context (the installed files, one string q_1 + " " + a_1 + "\n\n" + ... + q_N, as OLMES and
//     lm-eval render shots): split into turns as lm-eval's fewshot_as_multiturn builds them, each shot a user turn
//     (its question text q_i, ending in the answer marker, e.g. "Question: ...\nAnswer:") and an assistant turn
//     (its answer a_i), then the question's user turn q_N. A task description before the first shot (DROP's,
//     MMLU's "The following are ...") opens the first user turn; the model's default system turn stays.
//     Shots start with the task's question marker ("Question:" unless the task's rule says otherwise: "Problem:"
//     for minerva_math, "Passage:" for drop, "Title:" for squad, "Category:" for jeopardy, "Q:" for bbh and
//     truthfulqa) after "\n\n"; a shot's answer follows its last answer marker and one space; the final question
//     block is the last user turn as it is. The split is checked (exactly `shots` shots, each with its answer
//     marker and a non-empty answer); otherwise an error says to use OLMES' chat-format request files.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/eval/tasks.h"

namespace archspace {

struct ChatPrompt {
  nlohmann::json messages = nlohmann::json::array();  // [{"role", "content"}...], the last one the user's
  std::string assistant_prefix;                       // text the assistant turn starts with (often empty)
};

// How a task's plain few-shot context splits into turns.
struct FewShotMarkers {
  std::string question;  // each shot and the final question start with it ("Question:")
  std::string answer;    // the question text ends with it ("\nAnswer:"); the answer follows after one space
};
FewShotMarkers few_shot_markers(const std::string& task);

// The conversation of one request's `context` (a string or OLMES' chat-format object) for `task` with `shots`
// few-shot examples. Errors start with `where` (FILE:LINE (task T)) and name the field or the failed check.
ChatPrompt chat_prompt(const nlohmann::json& context, const std::string& task, int64_t shots, const std::string& where);

// The text the model is prompted with: the chat template's rendering with the generation prompt, then the
// assistant prefix.
std::string chat_prompt_text(const ChatPrompt& prompt, const std::string& where);

// A multiple-choice task's requests in the chat format: each context replaced by its chat prompt text (the
// continuations scored after it as before; the unconditional requests' "Answer:" too, as a 0-shot user turn).
void to_chat_format(TaskFiles& files);

// The token that ends an assistant turn (generation stops there): "<|im_end|>".
extern const char* const kChatTurnEnd;

}  // namespace archspace
