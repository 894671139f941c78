// archspace eval ppl: perplexity with strided sliding windows on token shards or a text file.
// archspace eval downstream: OLMES multiple-choice tasks (eval/downstream.h) and generation tasks
// (eval/generation_tasks.h, scored by eval/generation_metrics.h) through the library's pipeline
// (eval/downstream_pipeline.h, with eval/external_scorers.h's scorers); here the flags, a table and a JSON file;
// --rescore: the metrics of a requests-out file's generations recomputed (eval/generation_metrics.h), no model.
// The code tasks' programs run in eval/code_sandbox.h's sandbox.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

#include "archspace/data/token_source.h"
#include "archspace/eval/code_sandbox.h"
#include "archspace/eval/downstream.h"
#include "archspace/eval/downstream_pipeline.h"
#include "archspace/eval/external_scorers.h"
#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/perplexity.h"
#include "archspace/eval/suites.h"
#include "archspace/eval/task_groups.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/malloc_policy.h"
#include "archspace/util/progress.h"
#include "archspace/util/strings.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct PplArgs {
  std::string model, data, tokenizer, out, dtype = "fp32", device = "cpu", token_dtype, profile;
  std::string quantization = "none";
  int64_t max_tokens = 0;
  bool skip_checksums = false;
  PerplexityOptions options;
};

// A bad --out fails before the evaluation, not after it; an existing file is replaced only by a complete
// result (written beside it, then renamed).
void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path), dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
    throw Error(path + ": cannot write there (--out): " + dir.string() + " is not a writable directory");
  }
  if (fs::exists(p) && (!fs::is_regular_file(p) || ::access(p.c_str(), W_OK) != 0)) {
    throw Error(path + ": exists and is not a writable file (--out)");
  }
}

struct DownstreamArgs {
  std::string model, tasks, format = "rc", out, requests_out, tokenizer, dtype = "fp32", device = "cpu", rescore, suite,
                            profile;
  std::string quantization = "none", decode_steps = "eager", drop_dataset;
  std::vector<std::string> tasks_dirs;
  bool chat = false, no_prefix_sharing = false, skip_checksums = false;
  std::optional<int64_t> shots;
  int64_t limit = 0, batch_size = 0, batch_tokens = 8192, max_length = 0;
};

int run_rescore(const DownstreamArgs& a) {
  for (const auto* path : {&a.out, &a.requests_out}) {
    if (!path->empty()) check_writable(*path);
  }
  ProgressLine progress("eval downstream --rescore");
  const RescoreFile file = read_rescore_file(a.rescore);
  if (file.instances.empty())
    throw Error(a.rescore + ": no generation rows (rows with \"generation\" and \"gold\") to rescore");
  if (file.loglikelihood_rows > 0)
    progress.note(std::to_string(file.loglikelihood_rows) +
                  " log-likelihood rows kept as they are (their metrics need the task files: run eval downstream)");
  const NoteFn note = [&progress](const std::string& text) { progress.note(text); };
  const GenerationScores scored = score_and_aggregate(file.instances, file.shots, project_scorers(note), note);
  const std::vector<InstanceMetrics>& metrics = scored.metrics;
  const std::vector<TaskResult>& results = scored.results;
  progress.finish();
  std::cout << results_table(results) << std::flush;

  if (!a.requests_out.empty()) {
    std::string text;
    for (const auto& row : rescored_rows(file, metrics)) text += row.dump() + "\n";
    write_text_file_atomically(a.requests_out, text);
  }
  if (!a.out.empty()) {
    const nlohmann::json rows = rows_with_macro_over(results, scored.macro_over);
    const nlohmann::json j = {{"rescored", a.rescore},
                              {"instances", file.instances.size()},
                              {"loglikelihood_rows", file.loglikelihood_rows},
                              {"elapsed_seconds", progress.elapsed_seconds()},
                              {"stderr",
                               "lm-eval's standard error of the mean: sqrt(sample variance / n); a group's macro: "
                               "sqrt(sum of its tasks' squared standard errors) / tasks"},
                              {"results", rows},
                              {"scoring_errors", scored.scoring_errors}};
    write_text_file_atomically(a.out, j.dump(2) + "\n");
  }
  return 0;
}

// The flags that are not --rescore's, checked; the tasks they select.
DownstreamSelection downstream_selection(const DownstreamArgs& a, bool limit_given) {
  if (a.model.empty() || (a.tasks.empty() == a.suite.empty()))
    throw Error("--model and one of --tasks or --suite are required (unless --rescore)");
  if (limit_given && a.limit < 1) throw Error("--limit must be at least 1 (got " + std::to_string(a.limit) + ")");
  if (a.batch_size < 0 || a.batch_tokens < 1) throw Error("--batch-size must be >= 0 and --batch-tokens >= 1");
  DownstreamSelection selection;
  selection.tasks = split_nonempty(a.tasks, ',');
  selection.suite = a.suite;
  selection.tasks_dirs = a.tasks_dirs;
  selection.format = a.format;
  selection.shots = a.shots;
  selection.limit = a.limit;
  selection.chat = a.chat;
  selection.drop_dataset = a.drop_dataset;
  return selection;
}

// The pipeline's options from the flags, its progress on `progress`.
DownstreamOptions downstream_options(const DownstreamArgs& a, DecodeMode decode_steps, ProgressLine& progress,
                                     const NoteFn& note) {
  DownstreamOptions options;
  options.score.max_batch_sequences = a.batch_size;
  options.score.max_batch_tokens = a.batch_tokens;
  options.score.share_prefixes = !a.no_prefix_sharing;
  options.generation.max_batch = a.batch_size > 0 ? a.batch_size : 8;
  options.generation.max_length = a.max_length;
  options.generation.decode_steps = decode_steps;
  options.scorers = project_scorers(note);
  options.note = note;
  // A progress callback whose rate counts from when its phase starts (scoring, then generation).
  options.phase_progress = [&progress](const char* what) -> ProgressFn {
    return [&progress, what, start = progress.elapsed_seconds()](int64_t done, int64_t total) {
      const double s = progress.elapsed_seconds() - start;
      char rate[48];
      std::snprintf(rate, sizeof(rate), " | %.1f %s/s", s > 0 ? done / s : 0.0, what);
      progress.update(std::to_string(done) + "/" + std::to_string(total) + " " + what + rate,
                      static_cast<double>(done) / total, done == total);
    };
  };
  // A scorer that failed must not lose the generation time: the generations go to --requests-out first (without
  // metrics), so that `--rescore` can finish the job.
  if (!a.requests_out.empty()) {
    options.save_unscored = [&a, &progress](const std::string& lines) {
      write_text_file_atomically(a.requests_out, lines);
      progress.note("the generations were written to " + a.requests_out + " (rescore them with --rescore)");
    };
  }
  return options;
}

// --out's JSON.
nlohmann::json downstream_json(const DownstreamArgs& a, const std::string& tokenizer, bool chat, double elapsed,
                               const DownstreamResult& result,
                               const std::map<std::string, std::string>& prompts_differ) {
  const GenerationScores& scored = result.generation;
  nlohmann::json j = {{"model", a.model},
                      {"dtype", a.dtype},
                      {"quantization", a.quantization},
                      {"device", a.device},
                      {"tokenizer", tokenizer},
                      {"elapsed_seconds", elapsed},
                      {"requests", result.requests},
                      {"scoring_seconds", result.scoring_seconds},
                      {"generation_requests", result.instances.size()},
                      {"generation_seconds", result.generation_seconds},
                      {"stderr", "lm-eval's standard error of the mean: sqrt(sample variance / n)"},
                      {"results", rows_with_macro_over(result.shown, scored.macro_over)}};
  j["chat"] = chat;
  j["prompts_differ"] = prompts_differ;
  j["scoring_errors"] = scored.scoring_errors;
  if (result.suite) j["suite"] = suite_json(*result.suite);
  return j;
}

int run_downstream(const DownstreamArgs& a, bool limit_given) {
  if (!a.rescore.empty()) {
    if (!a.model.empty() || !a.tasks.empty() || !a.suite.empty() || limit_given || !a.tasks_dirs.empty() || a.chat ||
        !a.drop_dataset.empty())
      throw Error(
          "--rescore recomputes the metrics of a requests-out file without a model: it takes no --model, "
          "--tasks, --suite, --chat, --tasks-dir, --drop-dataset or --limit");
    return run_rescore(a);
  }
  const DownstreamSelection selection = downstream_selection(a, limit_given);
  const DecodeMode decode_steps = decode_mode_for(a.decode_steps, a.device);
  for (const auto* path : {&a.out, &a.requests_out}) {
    if (!path->empty()) check_writable(*path);
  }
  DownstreamPlan plan = plan_downstream(selection);
  const bool chat = plan.chat;
  ProgressLine progress("eval downstream");
  const NoteFn note = [&progress](const std::string& n) { progress.note(n); };
  // Each batch's activations and KV caches are fresh tensors of varying sizes: reused memory, not fresh mmaps.
  if (const std::string memory = keep_freed_memory_for_reuse(); !memory.empty()) progress.note(memory);
  for (const auto& n : plan.notes) progress.note(n);
  DownstreamPipeline pipeline(selection, std::move(plan), note);

  const std::string model_dir = model_dir_to_use(a.model, a.skip_checksums);
  CausalLM model =
      load_model(model_dir, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device(),
                             false, parse_quantization(a.quantization, "--quantization")});
  auto tokenizer = model_tokenizer(model_dir, a.tokenizer, model.config().vocab_size);
  CommandProfile profile(a.profile);  // the evaluation's work, not the loading
  pipeline.prepare(*tokenizer, model.config(), a.max_length);
  DownstreamResult result = pipeline.run(model, tokenizer, downstream_options(a, decode_steps, progress, note));
  progress.finish();
  profile.finish();

  std::vector<std::string> notes;
  pipeline.tabulate(result, &notes);
  for (const auto& n : notes) progress.note(n);
  std::cout << results_table(result.shown);
  const std::map<std::string, std::string> prompts_differ = pipeline.prompts_differ();
  if (result.suite) {
    std::cout << suite_table(*result.suite);  // with a line per task whose prompts differ
  } else {
    for (const auto& [task, how] : prompts_differ) std::cout << task << ": " << how << "\n";
  }
  std::cout << std::flush;

  if (!a.requests_out.empty()) write_text_file_atomically(a.requests_out, pipeline.request_lines(result));
  if (!a.out.empty()) {
    const auto j = downstream_json(a, tokenizer->name(), chat, progress.elapsed_seconds(), result, prompts_differ);
    write_text_file_atomically(a.out, j.dump(2) + "\n");
  }
  return 0;
}

int run_ppl(const PplArgs& a) {
  namespace fs = std::filesystem;
  if (!a.out.empty()) check_writable(a.out);
  const std::string model_dir =
      model_dir_to_use(a.model, a.skip_checksums);  // a run directory or checkpoint names its model
  CausalLM model =
      load_model(model_dir, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device(),
                             false, parse_quantization(a.quantization, "--quantization")});
  std::vector<int64_t> tokens;
  std::string tokenizer_name;
  if (detect_token_format(a.data)) {
    // Token shards, a Megatron prefix or OLMo-core files; without a manifest the model's vocabulary stands in.
    TokenSourceOptions source;
    source.vocab_size = model.config().vocab_size;
    source.eos_token_id = model.config().eos_token_id.value_or(-1);
    if (!a.token_dtype.empty()) source.dtype = parse_token_dtype(a.token_dtype);
    auto shards = open_token_source(a.data, source);
    tokenizer_name = shards->manifest().tokenizer_name;
    const uint64_t want = a.max_tokens > 0 ? static_cast<uint64_t>(a.max_tokens) : UINT64_MAX;
    std::vector<uint32_t> buf;
    for (size_t s = 0; s < shards->num_shards() && tokens.size() < want; ++s) {
      buf.resize(std::min<uint64_t>(shards->shard_tokens(s), want - tokens.size()));
      shards->read(s, 0, buf.size(), buf.data());
      tokens.insert(tokens.end(), buf.begin(), buf.end());
    }
  } else if (fs::is_directory(a.data)) {
    throw Error(a.data + ": --data is a directory without token files (manifest.json, .npy) or a text file");
  } else {
    auto tokenizer = model_tokenizer(model_dir, a.tokenizer, model.config().vocab_size);
    tokenizer_name = tokenizer->name();
    for (uint32_t id : encode_text_file(*tokenizer, a.data)) tokens.push_back(id);
  }
  if (a.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > a.max_tokens) tokens.resize(a.max_tokens);

  // The context: --context, else the length the model was trained at (a longer window scores positions it never
  // saw), else min(max_position_embeddings, 4096). Said on stderr and in the JSON, since it sets the number.
  PerplexityOptions options = a.options;
  std::string context_from = "--context";
  if (options.context == 0) {
    const int64_t max_pos = model.config().max_position_embeddings;
    if (const auto trained = trained_sequence_length(model_dir)) {
      options.context = std::min(*trained, max_pos);
      context_from = "the training length (" + checkpoint_of_model_dir(model_dir) + "/trainer_state.json)";
    } else {
      options.context = std::min<int64_t>(max_pos, 4096);
      context_from = "min(max_position_embeddings, 4096): no training length recorded";
    }
  }
  std::cerr << "eval ppl: context " << options.context << " tokens, from " << context_from << "\n";

  ProgressLine progress("eval ppl");
  if (const std::string note = keep_freed_memory_for_reuse(); !note.empty()) progress.note(note);
  CommandProfile profile(a.profile);
  const PerplexityResult r = perplexity(model, tokens, options, [&](int64_t done, int64_t total) {
    progress.update(std::to_string(done) + "/" + std::to_string(total) + " tokens", static_cast<double>(done) / total,
                    done == total);
  });
  progress.finish();
  profile.finish();
  const nlohmann::json j = {{"model", a.model},
                            {"data", a.data},
                            {"tokenizer", tokenizer_name},
                            {"dtype", a.dtype},
                            {"quantization", a.quantization},
                            {"tokens", tokens.size()},
                            {"scored_tokens", r.scored_tokens},
                            {"nll_sum", r.nll_sum},
                            {"mean_nll", r.nll_sum / r.scored_tokens},
                            {"perplexity", r.perplexity()},
                            {"context", r.context},
                            {"context_from", context_from},
                            {"stride", r.stride},
                            {"windows", r.windows},
                            {"method",
                             "strided sliding windows: each window scores only tokens no earlier window scored; ppl = "
                             "exp(total NLL / scored tokens)"},
                            {"seconds", progress.elapsed_seconds()}};
  if (!a.out.empty()) write_text_file_atomically(a.out, j.dump(2) + "\n");
  std::cout << j.dump(2) << std::endl;
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<PplArgs>();
  auto* eval = parent.add_subcommand("eval", "Evaluate a model (ppl: perplexity; downstream: OLMES tasks)");
  eval->require_subcommand(1);
  auto* ppl = eval->add_subcommand("ppl", "Perplexity on token shards or a text file (JSON result)");
  add_model_option(ppl, a->model, "model directory, or a checkpoint or finished run directory holding one");
  add_skip_checksums_option(ppl, a->skip_checksums);
  ppl->add_option("--data", a->data,
                  "token shards, a Megatron prefix DIR/NAME, OLMo-core .npy file(s), or a text file (tokenized with "
                  "the model's tokenizer)")
      ->required();
  ppl->add_option("--token-dtype", a->token_dtype,
                  "element type of OLMo-core .npy files without a manifest (default: the smallest holding the "
                  "model's vocabulary)")
      ->check(CLI::IsMember({"uint8", "uint16", "uint32", "uint64"}));
  ppl->add_option(
      "--context", a->options.context,
      "window length in tokens (default: the length the model was trained at, when its checkpoint records it; "
      "else min(max_position_embeddings, 4096))");
  ppl->add_option("--stride", a->options.stride,
                  "window start spacing in tokens (default = context: disjoint windows)");
  ppl->add_option("--max-tokens", a->max_tokens, "evaluate only the first N tokens");
  ppl->add_option("--tokenizer", a->tokenizer,
                  "tokenizer for text data (default: the one the model directory carries)");
  ppl->add_option("--out", a->out, "also write the JSON result here");
  add_dtype_option(ppl, a->dtype, "compute dtype");
  add_quantization_option(ppl, a->quantization);
  add_device_option(ppl, a->device);
  add_profile_option(ppl, a->profile);

  auto d = std::make_shared<DownstreamArgs>();
  auto* ds = eval->add_subcommand("downstream",
                                  "OLMES multiple-choice and generation tasks from their request files (table + "
                                  "JSON); --rescore: the generation metrics of a requests-out file, without a model");
  add_model_option(ds, d->model,
                   "model directory, or a checkpoint or finished run directory holding one (required unless --rescore)",
                   /*required=*/false);
  add_skip_checksums_option(ds, d->skip_checksums);
  ds->add_option("--tasks", d->tasks,
                 "comma-separated tasks or groups: arc_easy,arc_challenge,hellaswag,piqa,winogrande,openbookqa,"
                 "basic_arithmetic,mmlu (its 57 mmlu_<subject> tasks and their macro average),... "
                 "(required unless --rescore)");
  ds->add_option("--suite", d->suite,
                 "a suite of tasks with OLMES' settings, one table and its macro average: olmo3-sft (the seed's "
                 "eight-task SFT table; chat format). Its tasks are looked for in --tasks-dir, then the built-in "
                 "directories; tasks without files are listed as missing");
  ds->add_flag("--chat", d->chat,
               "prompt in the chat format (SFT/instruct models; OLMES use_chat_format): few-shot examples as "
               "user/assistant turns through the model's chat template, generation ending at the end of the turn");
  ds->add_option("--format", d->format, "rc (ranked classification), mc (lettered choices) or both")
      ->check(CLI::IsMember({"rc", "mc", "both"}))
      ->capture_default_str();
  ds->add_option("--shots", d->shots, "few-shot examples (default: 5 where the task has them, else its only count)");
  auto* limit = ds->add_option("--limit", d->limit, "evaluate only each task's first N documents");
  ds->add_option("--batch-size", d->batch_size, "sequences per forward (default: as many as --batch-tokens allows)");
  add_decode_steps_option(ds, d->decode_steps);
  ds->add_option("--batch-tokens", d->batch_tokens, "padded tokens per forward")->capture_default_str();
  ds->add_flag("--no-prefix-sharing", d->no_prefix_sharing,
               "score every request as a whole sequence (default: the choices of a document run their shared "
               "context once, and their continuations over its cached keys and values)");
  ds->add_option("--max-length", d->max_length,
                 "longest sequence run, in tokens; longer ones lose their start (default: max_position_embeddings)");
  ds->add_option("--drop-dataset", d->drop_dataset,
                 "a local copy of EleutherAI/drop (the Hugging Face datasets cache directory, a save_to_disk or hub "
                 "Parquet directory, or one training-split .arrow/.parquet file): drop's prompts become OLMES' "
                 "drop::llama3 (3 shots drawn from its training split, its validation documents)");
  ds->add_option("--tasks-dir", d->tasks_dirs,
                 "directory of OLMES task directories (repeatable; default: the built-in ones, or "
                 "ARCHSPACE_EVAL_TASKS)");
  ds->add_option("--tokenizer", d->tokenizer, "tokenizer (default: the one the model directory carries)");
  ds->add_option("--out", d->out, "write the results as JSON here");
  ds->add_option("--requests-out", d->requests_out,
                 "write every request's log-likelihood here (JSON lines); with --rescore: the rows with their "
                 "metrics recomputed");
  ds->add_option("--rescore", d->rescore,
                 "recompute every generation metric (per instance and per task) of a --requests-out file's "
                 "\"generation\" rows, without a model (gsm8k, minerva_math_*, drop, naturalqs_open, squad, coqa, "
                 "jeopardy, ifeval, bbh_*, popqa, codex_humaneval, codex_mbpp: their programs run in the sandbox)");
  add_dtype_option(ds, d->dtype, "compute dtype");
  add_quantization_option(ds, d->quantization);
  add_device_option(ds, d->device);
  add_profile_option(ds, d->profile);
  return {eval, [a, ppl, d, ds, limit]() -> int {
            if (ppl->parsed()) return run_ppl(*a);
            if (ds->parsed()) return run_downstream(*d, limit->count() > 0);
            return 1;  // unreachable: eval requires a subcommand
          }};
}

}  // namespace
ARCHSPACE_COMMAND(100, add);
}  // namespace archspace::cli
