#include "archspace/eval/chat_format.h"

#include <unordered_map>

#include "archspace/chat/chat.h"
#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/multiple_choice_task_family.h"
#include "archspace/text/python_str.h"
#include "archspace/util/error.h"

namespace archspace {

const char* const kChatTurnEnd = "<|im_end|>";

namespace {

std::string escaped_newlines(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

nlohmann::json turn(const char* role, std::string content) { return {{"role", role}, {"content", std::move(content)}}; }

// OLMES' re.sub("\\s*" + re.escape(prefix) + "\\s*$", "", msg) for a non-empty prefix (olmes
// oe_eval/tasks/base_task.py:536, 544, 557): the prefix followed by nothing but whitespace, and the whitespace before
// it, cut from the end; msg unchanged when it does not end so.
std::string without_prefix_at_end(const std::string& msg, const std::string& prefix) {
  const size_t tail = text::py_rstrip(msg).size();  // msg[tail:] is whitespace
  const size_t first = tail > prefix.size() ? tail - prefix.size() : 0;
  for (size_t p = first; p + prefix.size() <= msg.size(); ++p) {
    if (msg.compare(p, prefix.size(), prefix) != 0 || !text::py_rstrip(msg.substr(p + prefix.size())).empty()) continue;
    return text::py_rstrip(msg.substr(0, p));  // the leftmost match starts at the whitespace before p
  }
  return msg;
}

// OLMES' concat_with_space (olmes oe_eval/utils.py:371): both stripped, joined by a space when both are non-empty.
std::string concat_with_space(const std::string& a, const std::string& b) {
  const std::string x = text::py_strip(a), y = text::py_strip(b);
  return !x.empty() && !y.empty() ? x + " " + y : x.empty() ? y : x;
}

// OLMES' chat-format context: {"messages": [...], "assistant_prefix": "..."}; the roles and contents are checked
// where the template renders them (chat_prompt_text).
ChatPrompt chat_format_context(const nlohmann::json& context, const std::string& where) {
  ChatPrompt p;
  if (!context.contains("messages") || !context["messages"].is_array() || context["messages"].empty())
    throw Error(where + ": request.context.messages must be a non-empty list of {\"role\", \"content\"} messages");
  p.messages = context["messages"];
  const nlohmann::json& last = p.messages.back();
  if (!last.is_object() || last.value("role", nlohmann::json()) != "user")
    throw Error(where + ": the last message of request.context.messages must be the user's (the model answers it)");
  if (context.contains("assistant_prefix") && !context["assistant_prefix"].is_null()) {
    if (!context["assistant_prefix"].is_string())
      throw Error(where + ": request.context.assistant_prefix must be a string");
    p.assistant_prefix = context["assistant_prefix"].get<std::string>();
  }
  for (const auto& [key, value] : context.items()) {
    if (key != "messages" && key != "assistant_prefix")
      throw Error(where + ": request.context has an unknown field \"" + key + "\" (messages, assistant_prefix)");
  }
  return p;
}

// A plain context as OLMES' Task.fewshot_context turns it into messages under use_chat_format (olmes
// oe_eval/tasks/base_task.py:517-559; see the header) with the task's chat settings.
ChatPrompt split_few_shot(const std::string& context, const std::string& task, int64_t shots,
                          const std::string& where) {
  ChatPrompt p;
  const ChatSettings settings = chat_settings(task);
  p.assistant_prefix = settings.assistant_prefix;
  // base_task.py:536, 544 and 557: each user turn of a few-shot prompt loses the prefix at its end.
  const auto user = [&](const std::string& content) {
    return turn("user",
                settings.assistant_prefix.empty() ? content : without_prefix_at_end(content, p.assistant_prefix));
  };
  if (shots == 0) {  // base_task.py:521-527: the 0-shot user turn as it is
    p.messages.push_back(turn("user", context));
    return p;
  }
  if (!settings.fewshot_as_multiturn) {  // base_task.py:548-558: the shots and the question in one user turn
    p.messages.push_back(user(context));
    return p;
  }
  const FewShotMarkers m = few_shot_markers(task);
  const std::string advice = " (give OLMES' chat-format request files for this task: use_chat_format)";
  const std::string separator = "\n\n" + m.question;
  std::string description;
  size_t first = 0;
  if (!context.starts_with(m.question)) {
    const size_t p0 = context.find(separator);
    if (p0 == std::string::npos)
      throw Error(where + ": --chat cannot split the few-shot context: no shot starts with \"" + m.question + "\"" +
                  advice);
    first = p0 + 2;
    description = context.substr(0, first);  // a task description, "\n\n" included, opens the first user turn
  }
  std::vector<size_t> starts{first};
  for (size_t q = context.find(separator, first); q != std::string::npos; q = context.find(separator, q + 1))
    starts.push_back(q + 2);
  if (static_cast<int64_t>(starts.size()) != shots + 1)
    throw Error(where + ": --chat cannot split the few-shot context: it has " + std::to_string(starts.size()) +
                " blocks starting with \"" + m.question + "\" after a blank line, expected " +
                std::to_string(shots + 1) + " (" + std::to_string(shots) + " shots and the question)" + advice);
  // base_task.py:529-547: per shot the user turn doc_to_text(shot) (the description before the first) and the
  // assistant turn concat_with_space(assistant_prefix, doc_to_target(shot)); then the question's user turn.
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t end = k + 1 < starts.size() ? starts[k + 1] - 2 : context.size();
    const std::string block = context.substr(starts[k], end - starts[k]);
    if (k + 1 == starts.size()) {
      p.messages.push_back(user((k == 0 ? description : "") + block));
      break;
    }
    const size_t marker = block.rfind(m.answer);
    const size_t answer_at = marker == std::string::npos ? marker : marker + m.answer.size();
    if (marker == std::string::npos || block.compare(answer_at, 1, " ") != 0 || block.size() <= answer_at + 1)
      throw Error(where + ": --chat cannot split the few-shot context: shot " + std::to_string(k + 1) +
                  " has no answer after \"" + escaped_newlines(m.answer) + " \"" + advice);
    p.messages.push_back(user((k == 0 ? description : "") + block.substr(0, answer_at)));
    p.messages.push_back(turn("assistant", concat_with_space(p.assistant_prefix, block.substr(answer_at + 1))));
  }
  return p;
}

}  // namespace

FewShotMarkers few_shot_markers(const std::string& task) {
  // The task's family says how its prompts split (its own file in src/eval/tasks/).
  if (const GenerationTaskSpec* spec = find_generation_task(task)) {
    if (const auto markers = spec->family->few_shot_markers(task)) return *markers;
  }
  return multiple_choice_task_family(task).few_shot_markers(task);
}

ChatSettings chat_settings(const std::string& task) {
  if (const GenerationTaskSpec* spec = find_generation_task(task)) {
    if (const auto settings = spec->family->chat_settings(task)) return *settings;
  }
  return multiple_choice_task_family(task).chat_settings(task);
}

ChatPrompt chat_prompt(const nlohmann::json& context, const std::string& task, int64_t shots,
                       const std::string& where) {
  if (shots < 0) throw Error(where + ": the number of shots must be at least 0");
  if (context.is_object()) return chat_format_context(context, where);
  if (!context.is_string())
    throw Error(where + ": request.context must be a string or OLMES' chat-format {\"messages\": [...]} object");
  return split_few_shot(context.get<std::string>(), task, shots, where);
}

void to_chat_format(TaskFiles& files) {
  struct Rendered {
    std::string text;
    bool prefix = false;  // the prompt ends with an assistant prefix
  };
  std::unordered_map<std::string, Rendered> rendered;  // a document's choices share one context
  for (TaskRequest& r : files.requests) {
    const bool unconditional = files.uncond_offset > 0 && r.doc_id >= files.uncond_offset;
    const bool object = !r.chat_context.is_null();
    // olmes oe_eval/run_eval.py:214: only chat-format contexts are converted; OLMES' unconditional requests carry
    // the plain string "Answer:" (base_task.py:698-705) and keep it, and their continuation's space.
    if (unconditional && !object) continue;
    auto [it, added] = rendered.try_emplace((object ? "object " : "string ") + r.context);  // (an object's dump)
    if (added) {
      const std::string where =
          files.dir + "/requests.jsonl.gz (task " + files.task + ", document " + std::to_string(r.doc_id) + ")";
      const ChatPrompt prompt = chat_prompt(object ? r.chat_context : nlohmann::json(r.context), files.task,
                                            unconditional ? 0 : files.shots, where);
      it->second = {chat_prompt_text(prompt, where), !prompt.assistant_prefix.empty()};
    }
    r.context = it->second.text;
    r.chat_context = nullptr;
    // run_eval.py:229-231: without an assistant prefix the continuation loses its leading whitespace.
    if (!it->second.prefix) r.continuation = text::py_lstrip(r.continuation);
  }
}

std::string chat_prompt_text(const ChatPrompt& prompt, const std::string& where) {
  return archspace::chat_prompt_text(prompt.messages, where) + prompt.assistant_prefix;
}

}  // namespace archspace
