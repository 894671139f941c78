#include "archspace/eval/generation_tasks.h"

#include <limits>

#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/task_files.h"
#include "archspace/infer/scheduler.h"
#include "archspace/util/error.h"

namespace archspace {

std::vector<std::vector<GeneratedAnswer>> generate_answers(const CausalLM& model,
                                                           std::shared_ptr<const Tokenizer> tokenizer,
                                                           const std::vector<GenerationTaskFiles>& tasks,
                                                           const GenerationOptions& options,
                                                           const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  const int64_t max_length = options.max_length > 0 ? options.max_length : c.max_position_embeddings;
  if (max_length > c.max_position_embeddings)
    throw Error("--max-length " + std::to_string(max_length) + " exceeds the model's max_position_embeddings " +
                std::to_string(c.max_position_embeddings));
  std::vector<std::vector<GeneratedAnswer>> answers(tasks.size());
  std::vector<SequenceRequest> sequences;
  std::vector<std::pair<size_t, size_t>> where;  // (task, request) of each sequence
  for (size_t t = 0; t < tasks.size(); ++t) {
    for (size_t i = 0; i < tasks[t].requests.size(); ++i) {
      const GenerationRequest& r = tasks[t].requests[i];
      const std::string at = tasks[t].requests_path + ":" + std::to_string(r.line) + " (task " + tasks[t].task + ")";
      if (r.max_gen_toks >= max_length)
        throw Error(at + ": max_gen_toks " + std::to_string(r.max_gen_toks) + " leaves no room for a context in " +
                    std::to_string(max_length) + " positions (--max-length)");
      GeneratedAnswer a;
      a.prompt_tokens = tokenizer->encode(r.context);
      if (a.prompt_tokens.empty()) throw Error(at + ": the context has no tokens");
      // lm-eval's generate_until: the context keeps its last max_length - max_gen_toks tokens.
      const auto room = static_cast<size_t>(max_length - r.max_gen_toks);
      if (a.prompt_tokens.size() > room) {
        a.prompt_tokens.erase(a.prompt_tokens.begin(), a.prompt_tokens.end() - static_cast<std::ptrdiff_t>(room));
        a.truncated = true;
      }
      SequenceRequest s;
      s.prompt = a.prompt_tokens;
      s.max_tokens = r.max_gen_toks;
      if (r.do_sample && r.temperature > 0) {
        s.sampling.temperature = r.temperature;
        s.sampling.seed = static_cast<uint64_t>(r.doc_id);  // reproducible per document
      }
      if (c.eos_token_id) s.stop_ids.push_back(static_cast<uint32_t>(*c.eos_token_id));
      if (tasks[t].chat) {
        const auto turn_end = tokenizer->token_to_id(kChatTurnEnd);
        if (!turn_end) throw Error(at + ": --chat: the tokenizer has no " + std::string(kChatTurnEnd) + " token");
        s.stop_ids.push_back(*turn_end);
      }
      s.stop_strings = std::make_shared<const StopStrings>(r.stop_sequences);
      s.skip_special_tokens = true;  // lm-eval decodes a generation with skip_special_tokens
      sequences.push_back(std::move(s));
      where.emplace_back(t, i);
      answers[t].push_back(std::move(a));
    }
  }
  const auto total = static_cast<int64_t>(sequences.size());
  if (total == 0) return answers;

  SchedulerOptions so;
  so.max_batch = options.max_batch;
  so.max_queue = total;  // one submission holds every sequence; the scheduler admits them as rows free up
  so.prefill_chunk = options.prefill_chunk;
  so.decode_steps = options.decode_steps;
  so.caller_drives = true;  // the steps run on this thread (infer/scheduler.h)
  Scheduler scheduler(model, std::move(tokenizer), so);
  const std::shared_ptr<Ticket> ticket = scheduler.submit(std::move(sequences));
  if (!ticket) throw Error("the generation scheduler refused the requests");
  int64_t done = 0;
  const std::string error = scheduler.drive(*ticket, [&](const Ticket::Event& event) {
    if (event.final && progress) progress(++done, total);
  });
  if (!error.empty()) throw Error("generation failed: " + error);
  for (size_t k = 0; k < where.size(); ++k) {
    const SequenceResult& r = ticket->results()[k];
    GeneratedAnswer& a = answers[where[k].first][where[k].second];
    a.generation = r.text;
    a.finish_reason = r.finish_reason;
    a.generated_tokens = static_cast<int64_t>(r.tokens.size());
  }
  return answers;
}

}  // namespace archspace
