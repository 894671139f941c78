// A family of generation tasks as one registered definition (lm-eval's and OLMES' task = data + prompt +
// generation settings + metric): each family lives in one file of src/eval/tasks/ and says which tasks it has
// (their metrics, primary first) and the task groups it defines, how a request line gives a request's prompt and
// generation settings, the shape of their gold and where a request line keeps it, how a generation is scored (by
// metric name), how a metric aggregates over a task, and how its prompts split into chat turns. The generic code
// (eval/generation_metrics.h: scoring, aggregation, rescoring; the request-file reader; eval/task_groups.h) reaches a
// task only through its family: no task names outside the family's file.
//
// A new family: one file in src/eval/tasks/ defining a GenerationTaskFamily and registering it
// (eval/task_family_registration.h).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "archspace/eval/chat_format.h"
#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/task_groups.h"

namespace archspace {

// The kinds of scoring done outside C++ (the CLI runs lm-eval's own Python where C++ cannot reproduce it, and the
// code sandbox): a family declares the one it needs (GenerationTaskFamily::external_scorer).
enum class ExternalScorer {
  none,
  answer_equivalence,  // are two answers the same mathematical expression (sympy)
  instruction_checks,  // does a response follow its verifiable instructions
  program_execution,   // does a program pass its tests (the sandbox)
};

// The scorers of each kind, supplied by the caller: each is called at most once per scoring, with every instance
// that needs it.
struct ExternalScorers {
  AnswerEquivalence equivalence;  // answer_equivalence
  InstructionCheck instructions;  // instruction_checks
  CodeExecutor execute;           // program_execution
};

// One request's prompt and generation settings (eval/generation_tasks.h: a GenerationRequest holds them).
struct GenerationPrompt {
  std::string context;             // the text the model is prompted with (under --chat: the rendered chat)
  std::optional<ChatPrompt> chat;  // --chat: the conversation behind `context`
  std::vector<std::string> stop_sequences;
  int64_t max_gen_toks = 0;
  double temperature = 0;
  bool do_sample = false;
};

// The request file a line comes from: its task, config.json's task_config (and that file's path, for errors), the
// number of shots, and whether prompts are read in the chat format.
struct RequestFile {
  std::string task;
  const nlohmann::json& task_config;
  std::string config_path;
  int64_t shots = 0;
  bool chat = false;
};

class GenerationTaskFamily {
 public:
  virtual ~GenerationTaskFamily() = default;

  // The registry entries of the family's tasks (their `family` is set by the registry).
  virtual std::vector<GenerationTaskSpec> tasks() const = 0;

  // The prompt and generation settings of one request line (`where`: its file and line, for errors). By default
  // as OLMES rendered them into the line: request.context (a string; a conversation under file.chat),
  // request.stop_sequences, and request.generation_kwargs (max_gen_toks, temperature, do_sample), else the task
  // config's. Errors name the field.
  virtual GenerationPrompt read_prompt(const nlohmann::json& request_line, const RequestFile& file,
                                       const std::string& where) const;

  // Throws Error("field \"gold\" ...") when `gold` does not have the shape the task's metrics need.
  virtual void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const = 0;

  // The gold of one OLMES request line; by default its "label", checked. Errors name the field.
  virtual nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& request_line) const;

  // Scores `batch` (every instance of the family's tasks in one scoring; gold checked) into `out` (one per
  // instance, its values already the spec's metrics at 0): by metric name (set_metric). An instance whose own
  // scoring raises should be left to score_each, which zeroes it and records the error.
  virtual void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers& scorers,
                     const std::vector<InstanceMetrics*>& out) const = 0;

  // A task's value of `metric` from its instances' values; by default the mean with lm-eval's standard error.
  virtual MetricValue aggregate(const std::string& metric, const std::vector<const GenerationInstance*>& instances,
                                const std::vector<double>& values) const;

  // How the task's few-shot prompts split into chat turns (eval/chat_format.h); nullopt: the default markers.
  virtual std::optional<FewShotMarkers> few_shot_markers(const std::string& task) const;

  // How OLMES' instruct config renders the task's few-shot prompt in the chat format (eval/chat_format.h:
  // chat_settings); nullopt: the default (fewshot_as_multiturn, no assistant prefix).
  virtual std::optional<ChatSettings> chat_settings(const std::string& task) const;

  // The task groups the family defines (eval/task_groups.h), in report order.
  virtual std::vector<TaskGroup> groups() const { return {}; }

  // The scorer from outside C++ that scoring needs (a caller without it refuses the task up front).
  virtual ExternalScorer external_scorer() const { return ExternalScorer::none; }
  bool needs_external_scorer() const { return external_scorer() != ExternalScorer::none; }
  // Scoring runs generated programs (the code sandbox must be available before generating).
  bool runs_programs() const { return external_scorer() == ExternalScorer::program_execution; }
};

// The registry: every family once, by the order its registration states (eval/task_family_registration.h).
const std::vector<const GenerationTaskFamily*>& generation_task_families();

// Helpers the families share.
void set_metric(InstanceMetrics& metrics, const std::string& name, double value);  // throws for an unknown name
double metric_value(const InstanceMetrics& metrics, const std::string& name);      // throws for an unknown name
// Runs `score_one` on each instance; one that raises scores 0 on every metric, its error in scoring_errors.
void score_each(const std::vector<const GenerationInstance*>& batch, const std::vector<InstanceMetrics*>& out,
                const std::function<void(const GenerationInstance&, InstanceMetrics&)>& score_one);
// The usual gold shapes: a string; a string or a non-empty list of strings (strings_gold reads either as a list).
void check_string_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold);
void check_strings_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold);
std::vector<std::string> strings_gold(const nlohmann::json& gold);
bool all_strings(const nlohmann::json& j);  // a non-empty array of strings
// gold_from_request's common step: `gold` (nullptr when absent) checked, errors naming `field` (e.g. "label").
nlohmann::json checked_gold_field(const GenerationTaskSpec& spec, const nlohmann::json* gold, const std::string& field);

}  // namespace archspace
