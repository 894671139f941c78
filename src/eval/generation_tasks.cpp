#include "archspace/eval/generation_tasks.h"

#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/tasks.h"
#include "archspace/infer/scheduler.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"

namespace archspace {

namespace fs = std::filesystem;

bool is_generation_task(const std::string& task) { return find_generation_task(task) != nullptr; }

namespace {

// The request's generation settings: request.generation_kwargs, else the config's (both as OLMES writes them).
void read_generation_kwargs(const nlohmann::json& kwargs, GenerationRequest& r, const std::string& where) {
  r.max_gen_toks = json_int_field(kwargs, "max_gen_toks", where);
  if (r.max_gen_toks < 1) throw Error(where + ": max_gen_toks must be at least 1");
  if (kwargs.contains("temperature")) {
    if (!kwargs["temperature"].is_number()) throw Error(where + ": field \"temperature\" must be a number");
    r.temperature = kwargs["temperature"].get<double>();
    if (!(r.temperature >= 0 && r.temperature <= 2)) throw Error(where + ": temperature must be in [0, 2]");
  }
  if (kwargs.contains("do_sample")) {
    if (!kwargs["do_sample"].is_boolean()) throw Error(where + ": field \"do_sample\" must be true or false");
    r.do_sample = kwargs["do_sample"].get<bool>();
  }
}

}  // namespace

GenerationTaskFiles load_generation_task(const std::string& variant_dir, const std::string& task, int64_t limit,
                                         bool chat) {
  if (limit < 0) throw Error("the document limit must be at least 1 (0: all), got " + std::to_string(limit));
  const GenerationTaskSpec* spec = find_generation_task(task);
  if (!spec) throw Error("task \"" + task + "\" is not a generation task");
  GenerationTaskFiles t;
  t.task = task;
  t.dir = variant_dir;
  t.chat = chat;
  const std::string config_path = (fs::path(variant_dir) / "config.json").string();
  const nlohmann::json config = read_json_file(config_path);
  const nlohmann::json& task_config = json_field(config, "task_config", config_path);
  t.shots = json_int_field(task_config, "num_shots", config_path + " task_config");

  t.requests_path = (fs::path(variant_dir) / "requests.jsonl.gz").string();
  std::istringstream lines(read_gzip_file(t.requests_path));
  std::set<int64_t> seen;
  int64_t line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    const std::string where = t.requests_path + ":" + std::to_string(line_no) + " (task " + task + ")";
    const auto j = parse_json_line(line, where);
    if (!j) continue;
    GenerationRequest r;
    r.line = line_no;
    r.doc_id = json_int_field(*j, "doc_id", where);
    if (!seen.insert(r.doc_id).second) throw Error(where + ": document " + std::to_string(r.doc_id) + " appears twice");
    r.native_id = j->contains("native_id") ? (*j)["native_id"] : nlohmann::json();
    const nlohmann::json& request = json_field(*j, "request", where);
    const nlohmann::json& context = json_field(request, "context", where + " request");
    if (chat) {
      r.chat = chat_prompt(context, task, t.shots, where);
      r.context = chat_prompt_text(*r.chat, where);
    } else if (context.is_object()) {
      throw Error(where + ": request.context is a chat-format conversation (OLMES' use_chat_format): add --chat");
    } else {
      r.context = json_string_field(request, "context", where + " request");
    }
    const nlohmann::json& stops = json_field(request, "stop_sequences", where + " request");
    if (!stops.is_array()) throw Error(where + ": request.stop_sequences must be a list of strings");
    for (const auto& s : stops) {
      if (!s.is_string()) throw Error(where + ": request.stop_sequences must be a list of strings");
      if (s.get<std::string>().empty())
        throw Error(where + ": request.stop_sequences has an empty string (it would stop before any text)");
      r.stop_sequences.push_back(s.get<std::string>());
    }
    read_generation_kwargs(request.contains("generation_kwargs")
                               ? request["generation_kwargs"]
                               : json_field(task_config, "generation_kwargs", config_path + " task_config"),
                           r, where + " request.generation_kwargs");
    try {
      r.gold = gold_from_request(*spec, *j);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    t.requests.push_back(std::move(r));
    if (limit > 0 && static_cast<int64_t>(t.requests.size()) >= limit) break;
  }
  if (t.requests.empty()) throw Error(t.requests_path + ": no requests (task " + task + ")");
  return t;
}

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
  Scheduler scheduler(model, std::move(tokenizer), so);
  const std::shared_ptr<Ticket> ticket = scheduler.submit(std::move(sequences));
  if (!ticket) throw Error("the generation scheduler refused the requests");
  int64_t done = 0;
  while (const auto event = ticket->next_event()) {
    if (event->final && progress) progress(++done, total);
  }
  ticket->wait();
  if (const std::string error = ticket->error(); !error.empty()) throw Error("generation failed: " + error);
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
