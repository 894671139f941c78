// Chat-format evaluation of SFT/instruct models (`eval downstream --chat`): OLMES' use_chat_format as its instruct
// (`::tulu`) configs set it per task. A request's context becomes a conversation rendered by the model's chat
// template with the generation prompt (chat/chat.h, equal to the exported tokenizer's apply_chat_template(...,
// add_generation_prompt=True)), followed by an assistant prefix if the request has one: OLMES'
// convert_chat_instance (olmes oe_eval/run_eval.py:213-232).
//
// Where the conversation comes from:
//   - a chat-format request file (OLMES with use_chat_format writes request.context as {"messages": [{"role",
//     "content"}...], "assistant_prefix": "..."}): as it is, generation or multiple choice;
//   - a plain context (the installed files; OLMES' non-chat rendering, description + q_1 + a_1 + "\n\n" + ... + q_N
//     with a_i = " " + answer): the conversation OLMES' Task.fewshot_context builds for the task under use_chat_format
//     (olmes oe_eval/tasks/base_task.py:517-559) with the task's chat settings (chat_settings below):
//       * 0 shots: one user turn, the context;
//       * fewshot_as_multiturn false (truthfulqa::tulu, drop::llama3): one user turn, the whole context;
//       * fewshot_as_multiturn true (the others): per shot a user turn (its question text q_i, through the answer
//         marker, e.g. "Question: ...\nAnswer:") and an assistant turn (its answer, whitespace-stripped:
//         concat_with_space(assistant_prefix, a_i)), then the question's user turn q_N; a task description before
//         the first shot (MMLU's "The following are ...") opens the first user turn; the model's default system
//         turn stays (no ::tulu config sets a system prompt).
//     With an assistant prefix (gsm8k::tulu's "Answer:"), the prefix and the whitespace around it are cut from the
//     end of each user turn of a few-shot prompt (OLMES' re.sub("\\s*" + re.escape(prefix) + "\\s*$", "", msg)),
//     and the prompt ends with it after the generation prompt.
//     Shots start with the task's question marker ("Question:" unless the task's rule says otherwise: "Problem:"
//     for minerva_math, "Passage:" for drop, "Title:" for squad, "Category:" for jeopardy, "Q:" for bbh, popqa and
//     truthfulqa) after "\n\n"; a shot's answer follows its last answer marker and one space; the final question
//     block is the last user turn. The split is checked (exactly `shots` shots, each with its answer marker and a
//     non-empty answer); otherwise an error says to use OLMES' chat-format request files.
// A multiple-choice request rendered so has its continuation's leading whitespace stripped when the prompt has
// no assistant prefix (convert_chat_instance); unconditional requests with a plain context ("Answer:") stay as
// they are, as OLMES converts only chat-format contexts.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/eval/task_files.h"

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

// How OLMES' instruct config of a task renders its few-shot prompt in the chat format (context_kwargs after the
// chat_overrides): fewshot_as_multiturn and assistant_prefix. The default (true, ""), as mmlu:mc::tulu,
// minerva_math::tulu, bbh:cot-v1::tulu and popqa::tulu set it; a generation family may say otherwise for its
// tasks (gsm8k::tulu: "Answer:"; drop::llama3: one user turn), truthfulqa::tulu is one user turn.
struct ChatSettings {
  bool fewshot_as_multiturn = true;
  std::string assistant_prefix;
};
ChatSettings chat_settings(const std::string& task);

// The conversation of one request's `context` (a string or OLMES' chat-format object) for `task` with `shots`
// few-shot examples. Errors start with `where` (FILE:LINE (task T)) and name the field or the failed check.
ChatPrompt chat_prompt(const nlohmann::json& context, const std::string& task, int64_t shots, const std::string& where);

// The text the model is prompted with: the chat template's rendering with the generation prompt, then the
// assistant prefix.
std::string chat_prompt_text(const ChatPrompt& prompt, const std::string& where);

// A multiple-choice task's requests in the chat format: each context (a string, or OLMES' chat-format object kept
// in TaskRequest::chat_context) replaced by its chat prompt text, the continuation's leading whitespace stripped
// when the prompt has no assistant prefix; unconditional requests with a string context unchanged (see the top).
void to_chat_format(TaskFiles& files);

// The token that ends an assistant turn (generation stops there): "<|im_end|>".
extern const char* const kChatTurnEnd;

}  // namespace archspace
