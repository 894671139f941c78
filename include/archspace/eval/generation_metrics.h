// Metrics of generation tasks (OLMES request files typed generate_until): per instance, from the generated
// text and the task's gold, as lm-evaluation-harness 0.4.13 and OLMES compute them, and per task (mean and
// lm-eval's standard error) with the group macro averages. Independent of the model: `eval downstream
// --rescore` scores a requests-out file with these alone.
//
// The registry: one entry per task, named as its request directory, each family defined in its own file of
// src/eval/tasks/ (eval/generation_task_family.h), whose opening comment says how its metrics are computed and
// whose header under include/archspace/eval/tasks/ declares the functions its tests call.
//
// Not thread-safe: the compiled patterns are cached and share their match data.
//
// Python string semantics and `re` (str.lower, strip, split, float() and repr(float) for DROP's numbers; PCRE2 in
// UTF and Unicode-property mode) are the text module's (text/python_str.h, text/python_re.h).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "archspace/eval/downstream.h"
#include "archspace/text/python_re.h"
#include "archspace/text/python_str.h"

namespace archspace {

class GenerationTaskFamily;

struct GenerationTaskSpec {
  std::string task;
  std::string group;                 // "minerva_math" for the seven subjects, else empty
  std::vector<std::string> metrics;  // in output order, the primary first
  std::string primary_metric;
  const GenerationTaskFamily* family = nullptr;  // its definition: gold, scoring, aggregation, prompts
};

// The registry entry of `task`; nullptr when the task is not a generation task known here.
const GenerationTaskSpec* find_generation_task(const std::string& task);
std::vector<std::string> generation_task_names();  // sorted

// The groups whose macro averages are reported, with their members.
std::vector<std::pair<std::string, std::vector<std::string>>> generation_groups();

// Throws Error("field \"gold\" ...") when `gold` does not have the shape the task's metrics need.
void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold);

// True when `task` is a registry task whose scoring runs the generated programs (it needs the code sandbox).
bool runs_programs(const std::string& task);

// Decides is_equiv for (answer, gold) pairs of normalised Minerva answers, as lm-eval 0.4.3 (OLMES' pin) decides
// it, identical strings included: one bool per pair.
using AnswerEquivalence = std::function<std::vector<bool>(const std::vector<std::pair<std::string, std::string>>&)>;

// IFEval's checks of (doc, response) pairs (doc: the instance's gold), one result per pair.
struct InstructionResult {
  bool prompt_strict = false, prompt_loose = false;
  std::vector<bool> inst_strict, inst_loose;  // one per instruction of the doc
  std::vector<std::string> scoring_errors;    // the checks that raised (each scored False, as OLMES does)
};
using InstructionCheck =
    std::function<std::vector<InstructionResult>(const std::vector<std::pair<nlohmann::json, std::string>>&)>;
// Runs each program against its tests: one bool per program, true when it passed.
using CodeExecutor = std::function<std::vector<bool>(const std::vector<std::string>& programs)>;

struct GenerationInstance {
  std::string task;
  nlohmann::json doc_id, native_id;
  std::string generation;
  nlohmann::json gold;
};

struct InstanceMetrics {
  std::vector<std::pair<std::string, double>> values;  // (metric name, value), in the task's metric order
  // What raised while scoring this instance (the instance then scores as OLMES scores a failed check: 0 / False).
  std::vector<std::string> scoring_errors;
};

// Per-instance metrics of every instance (their tasks must be in the registry and their gold checked).
// `equivalence` is called once, for the Minerva (answer, gold) pairs, identical ones included, and only when there
// are some;
// `instructions` once for the ifeval instances, when there are some (their results checked against the docs);
// `execute` once, with the code tasks' programs (genmetrics::code_program), and only when there are some.
// An instance whose own extraction raises (e.g. a regular expression's match limit on a degenerate response) scores 0
// on every metric with the error in its scoring_errors: one response never ends a run.
std::vector<InstanceMetrics> score_generations(const std::vector<GenerationInstance>& instances,
                                               const AnswerEquivalence& equivalence,
                                               const InstructionCheck& instructions = nullptr,
                                               const CodeExecutor& execute = nullptr);

// Per task (in the order tasks first appear), format "gen": every metric's mean and standard error (ifeval's
// inst_level metrics: over instructions, see above); shots as given per task (-1: unknown). Then one row per group
// with members present: the macro average of each metric over those members (stderr: sqrt(sum of the members'
// squared standard errors) / members), n the members' documents summed; a group whose primary aggregate is micro
// (bbh) also has each metric over the members' documents pooled (aggregate "micro", the primary one).
// `macro_over` receives, per group result, the members it averages.
std::vector<TaskResult> generation_results(const std::vector<GenerationInstance>& instances,
                                           const std::vector<InstanceMetrics>& metrics,
                                           const std::vector<std::pair<std::string, int64_t>>& shots,
                                           std::vector<std::pair<std::string, std::vector<std::string>>>* macro_over);

// The gold of one OLMES request line (a requests.jsonl.gz line) of a registry task: doc.answers for drop (the list of
// gold span lists; the line's continuation is tuple text, not the gold), the doc's test fields for the code tasks,
// else its label. Throws naming the field
// when missing or of the wrong shape (check_gold).
nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& request_line);

// One instance's metrics as a requests-out row's "metrics" object {name: value}.
nlohmann::json metrics_json(const InstanceMetrics& metrics);

// The requests-out row of one generation (the contract read_rescore_file reads back): {"task", "format": "gen",
// "shots", "doc_id", "native_id", "prompt_tokens", "generation", "gold", "metrics"}, and "scoring_errors" (strings)
// when scoring it raised.
nlohmann::json generation_row(const GenerationInstance& instance, int64_t shots,
                              const std::vector<int64_t>& prompt_tokens, const InstanceMetrics& metrics);

// A requests-out file read for rescoring (`eval downstream --rescore`): JSON lines; a generation row has "task"
// (a registry task), "doc_id", "generation" (string) and "gold" (the task's shape, check_gold), and may have
// "native_id", "prompt_tokens", "metrics" (replaced), "format" ("gen") and "shots" (an integer, one per task);
// rows without "generation" that have "loglikelihood" (multiple-choice requests) are kept as they are and
// counted. Anything else, a malformed line, an unknown task or a document twice in a task is an Error
// "PATH:LINE: ..." naming the field.
struct RescoreFile {
  std::vector<GenerationInstance> instances;
  std::vector<nlohmann::json> rows;                    // every row, in file order
  std::vector<size_t> instance_rows;                   // instances[i] came from rows[instance_rows[i]]
  std::vector<std::pair<std::string, int64_t>> shots;  // per task that gives them
  int64_t loglikelihood_rows = 0;
};
RescoreFile read_rescore_file(const std::string& path);
// The file's rows in their order with each generation row's "metrics" (and "scoring_errors", when scoring it raised)
// replaced by `metrics` (one per file.instances), what `--rescore --requests-out` writes.
std::vector<nlohmann::json> rescored_rows(const RescoreFile& file, const std::vector<InstanceMetrics>& metrics);

// The pure functions the families share (exposed for the unit tests); each family's own are in its header under
// include/archspace/eval/tasks/.
namespace genmetrics {

// The text module's Python semantics, under the names the metrics' tests use.
using text::py_capitalize;
using text::py_float_repr;
using text::py_is_float;
using text::py_lower;
using text::py_regex_escape;
using text::py_split;
using text::py_strip;
using text::regex_filter;
using text::regex_sub;

// lm-eval's exact_match (exact_match_hf_evaluate) of one prediction against one reference.
bool exact_match(std::string prediction, std::string reference, const std::vector<std::string>& regexes_to_ignore,
                 bool ignore_case, bool ignore_punctuation);

}  // namespace genmetrics

}  // namespace archspace
