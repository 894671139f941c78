// The downstream evaluation as one pipeline, what `eval downstream` runs and what the training loop's
// eval.downstream can run: the tasks and groups (or a suite) planned before the model loads, their request files
// read, the multiple-choice requests scored on their log-likelihoods (eval/downstream.h), the generation requests
// decoded on the engine (eval/generation_tasks.h) and scored by their task families (eval/generation_metrics.h),
// then the groups' rows and the suite's table. The caller parses its flags, supplies the scorers C++ cannot be
// (eval/generation_task_family.h: ExternalScorers) and prints or logs the results.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "archspace/eval/downstream.h"
#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/suites.h"

namespace archspace {

struct DownstreamSelection {
  std::vector<std::string> tasks;       // task and group names (eval/task_groups.h), or
  std::string suite;                    // a suite (eval/suites.h)
  std::vector<std::string> tasks_dirs;  // empty: default_task_dirs(); a suite reads these, then the defaults
  std::string format = "rc";            // the multiple-choice tasks' format
  std::optional<int64_t> shots;         // the multiple-choice tasks' shots (unset: each task's default)
  int64_t limit = 0;                    // documents per task (0: all)
  bool chat = false;                    // prompts in the chat format (a chat suite sets it too)
  // A local copy of EleutherAI/drop (a file or directory): drop's prompts are drop::llama3's, rendered from it
  // (eval/tasks/drop_llama3.h). Empty: the installed files' prompts.
  std::string drop_dataset;
};

// What runs, found before the model loads (a typo fails at once): the multiple-choice variants, the generation tasks
// (their own request files, format "gen", told apart by the task registry), the names whose group rows are added,
// and for a suite the suite's plan (its tasks with files, and the missing ones).
struct DownstreamPlan {
  std::vector<std::string> dirs;
  std::vector<TaskVariant> variants;
  std::vector<std::string> generation_tasks, choice_names, notes;
  std::optional<SuitePlan> suite;
  bool chat = false;  // the selection's, or the suite's
};
DownstreamPlan plan_downstream(const DownstreamSelection& selection);

using NoteFn = std::function<void(const std::string&)>;
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Generations scored: per instance, per task and the groups' macros.
struct GenerationScores {
  std::vector<InstanceMetrics> metrics;
  std::vector<TaskResult> results;
  std::vector<std::pair<std::string, std::vector<std::string>>> macro_over;
  // The instances whose scoring raised (scored as OLMES scores a failed check): {"count", "instances": [{"task",
  // "doc_id", "errors"}]}, in the --out JSON so that a run's few unscorable responses are seen, not hidden.
  nlohmann::json scoring_errors = {{"count", 0}, {"instances", nlohmann::json::array()}};
};
// Scores and aggregates `instances`; notes the responses whose checks raised and a group averaged over fewer tasks
// than it has.
GenerationScores score_and_aggregate(const std::vector<GenerationInstance>& instances,
                                     const std::vector<std::pair<std::string, int64_t>>& shots,
                                     const ExternalScorers& scorers, const NoteFn& note);

// results_rows with each generation group's row naming the tasks its macro is over.
nlohmann::json rows_with_macro_over(const std::vector<TaskResult>& results,
                                    const std::vector<std::pair<std::string, std::vector<std::string>>>& macro_over);

struct DownstreamOptions {
  ScoreOptions score;            // the multiple-choice requests' batches
  GenerationOptions generation;  // the generation requests' batches and length
  ExternalScorers scorers;
  NoteFn note;
  // A progress callback for a phase ("requests", then "generations"), asked for when the phase starts.
  std::function<ProgressFn(const char* what)> phase_progress;
  // Called with the generations as requests-out lines (no metrics) when their scoring raised, before it rethrows,
  // so that the generation time is not lost (`eval downstream --rescore` finishes the job).
  std::function<void(const std::string& lines)> save_unscored;
};

struct DownstreamResult {
  std::vector<TaskResult> choice_results;             // per multiple-choice task, in the plan's order
  std::vector<std::vector<GeneratedAnswer>> answers;  // per generation task, per request
  std::vector<GenerationInstance> instances;          // in task, then request order
  std::vector<std::pair<std::string, int64_t>> generation_shots;
  GenerationScores generation;
  int64_t requests = 0;   // multiple-choice requests
  int64_t truncated = 0;  // generation contexts left-truncated to fit
  double scoring_seconds = 0, generation_seconds = 0;
  // tabulate(): the multiple-choice rows with their groups', then the generation rows; the suite's report.
  std::vector<TaskResult> shown;
  std::optional<SuiteReport> suite;
};

class DownstreamPipeline {
 public:
  // Reads the plan's request files (a code task without the sandbox fails here, before any generation).
  DownstreamPipeline(const DownstreamSelection& selection, DownstreamPlan plan, const NoteFn& note);

  const DownstreamPlan& plan() const { return plan_; }
  bool empty() const { return files_.empty() && tasks_.empty() && generation_files_.empty(); }
  // The generation tasks whose scoring needs an ExternalScorers entry (Minerva's is_equiv, IFEval, code).
  std::vector<std::string> tasks_needing_external_scorers() const;

  // Tokenizes the multiple-choice requests for the model (once: run may repeat, as in training).
  void prepare(const Tokenizer& tokenizer, const ModelConfig& config, int64_t max_length);

  // Scores, generates and scores the generations (prepare first).
  DownstreamResult run(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer,
                       const DownstreamOptions& options) const;

  // The rows shown: the multiple-choice tasks' with their groups' (notes: the groups averaged over fewer tasks), the
  // generation tasks' and groups', and the suite's report.
  void tabulate(DownstreamResult& result, std::vector<std::string>* notes) const;

  // The generation tasks' requests as read (prompts rendered), per task in the plan's order.
  const std::vector<GenerationTaskFiles>& generation_files() const { return generation_files_; }
  // Per generation task whose prompts differ from its OLMES spec's, how (GenerationTaskFiles::prompts_differ).
  std::map<std::string, std::string> prompts_differ() const;

  // The --requests-out lines of a result: the multiple-choice requests, then the generations.
  std::string request_lines(const DownstreamResult& result) const;

 private:
  DownstreamPlan plan_;
  std::vector<TaskFiles> files_;  // until prepare
  std::vector<PreparedTask> tasks_;
  std::vector<GenerationTaskFiles> generation_files_;
  double prepare_seconds_ = 0;
};

}  // namespace archspace
