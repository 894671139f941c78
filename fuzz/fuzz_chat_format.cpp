// libFuzzer target: `eval downstream --chat`'s rendering of a request context (eval/chat_format.h). The first byte
// picks the task (its few-shot markers), the second the shot count; the rest is the context, either JSON (a string,
// or OLMES' chat-format {"messages", "assistant_prefix"} object, or anything else) or, when it does not parse, the
// raw text as a plain few-shot context. Only archspace::Error may come out.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "archspace/eval/chat_format.h"
#include "archspace/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const char* const tasks[] = {"gsm8k",    "minerva_math_algebra", "drop",         "squad",
                                      "jeopardy", "bbh_navigate",         "mmlu_anatomy", "truthfulqa"};
  const std::string task = tasks[data[0] % (sizeof(tasks) / sizeof(tasks[0]))];
  const int64_t shots = data[1] % 10;
  const std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  nlohmann::json context = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (context.is_discarded()) context = text;
  try {
    const archspace::ChatPrompt prompt = archspace::chat_prompt(context, task, shots, "fuzz");
    (void)archspace::chat_prompt_text(prompt, "fuzz");
  } catch (const archspace::Error&) {
  }
  return 0;
}
