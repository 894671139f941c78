#include "archspace/eval/downstream_pipeline.h"

#include <algorithm>
#include <chrono>

#include "archspace/eval/chat_format.h"
#include "archspace/eval/code_sandbox.h"
#include "archspace/eval/task_files.h"
#include "archspace/eval/task_groups.h"
#include "archspace/eval/tasks/drop_llama3.h"
#include "archspace/util/error.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void say(const NoteFn& note, const std::string& text) {
  if (note) note(text);
}

// The installed drop files are drop::olmes's; a chat run stands for drop::llama3 (the seed's table).
const char* const kInstalledDropDiffers =
    "not drop::llama3's prompts: the installed files are drop::olmes's (5 OLMES:drop shots after OLMES' "
    "reading-comprehension description, 1000 of the 9536 validation documents), where drop::llama3 has 3 shots "
    "drawn from DROP's training split (random.Random(1234).sample) and no description, over the whole validation "
    "split: give a local copy of EleutherAI/drop with --drop-dataset";

// The installed variant of a task, or "" when there is none (a --drop-dataset copy may not need it).
std::string installed_variant(const std::vector<std::string>& dirs, const std::string& task) {
  try {
    return find_generation_variant(dirs, task);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

DownstreamPlan plan_downstream(const DownstreamSelection& s) {
  DownstreamPlan p;
  if (!s.suite.empty()) {
    const Suite* suite = find_suite(s.suite);
    if (!suite) throw Error("unknown suite \"" + s.suite + "\" (suites: " + join(suite_names()) + ")");
    // The user's request files first (the tasks no package ships), then the built-in ones.
    p.dirs = s.tasks_dirs;
    for (const auto& d : default_task_dirs()) p.dirs.push_back(d);
    p.suite = plan_suite(*suite, p.dirs);
    for (const auto& e : p.suite->entries) {
      if (!e.missing.empty()) {
        p.notes.push_back("suite " + suite->name + ": " + e.task.name + " is missing (" + e.missing + ")");
      } else if (e.task.kind == "gen") {
        p.generation_tasks.insert(p.generation_tasks.end(), e.members.begin(), e.members.end());
      } else {
        for (auto& v : select_task_variants(p.dirs, e.members, e.task.kind, e.task.shots, &p.notes))
          p.variants.push_back(std::move(v));
        p.choice_names.push_back(e.task.name);
      }
    }
    p.chat = s.chat || p.suite->suite->chat;
    return p;
  }
  p.dirs = s.tasks_dirs.empty() ? default_task_dirs() : s.tasks_dirs;
  p.chat = s.chat;
  std::vector<std::string> choice_tasks;
  for (const auto& task : expand_task_groups(p.dirs, s.tasks))
    (is_generation_task(task) ? p.generation_tasks : choice_tasks).push_back(task);
  for (const auto& name : s.tasks) {  // the groups and tasks whose rows with_group_results builds
    const TaskGroup* group = find_task_group(name);
    if (group ? !is_generation_task(group->members.front()) : !is_generation_task(name)) p.choice_names.push_back(name);
  }
  if (!choice_tasks.empty()) p.variants = select_task_variants(p.dirs, choice_tasks, s.format, s.shots, &p.notes);
  return p;
}

GenerationScores score_and_aggregate(const std::vector<GenerationInstance>& instances,
                                     const std::vector<std::pair<std::string, int64_t>>& shots,
                                     const ExternalScorers& scorers, const NoteFn& note) {
  GenerationScores g;
  g.metrics = score_generations(instances, scorers.equivalence, scorers.instructions, scorers.execute);
  g.results = generation_results(instances, g.metrics, shots, &g.macro_over);
  for (size_t i = 0; i < instances.size(); ++i) {
    if (g.metrics[i].scoring_errors.empty()) continue;
    g.scoring_errors["instances"].push_back(
        {{"task", instances[i].task}, {"doc_id", instances[i].doc_id}, {"errors", g.metrics[i].scoring_errors}});
  }
  g.scoring_errors["count"] = g.scoring_errors["instances"].size();
  if (g.scoring_errors["count"] != 0)
    say(note, g.scoring_errors["count"].dump() +
                  " responses had a check that raised; those checks scored 0/False as OLMES does (\"scoring_errors\" "
                  "in --out and in their --requests-out rows)");
  for (const auto& [group, members] : g.macro_over) {
    for (const auto& [name, all] : generation_groups()) {
      if (name == group && members.size() < all.size())
        say(note, group + (find_task_group(group)->primary_aggregate == "micro" ? ": micro and macro" : ": macro") +
                      " over " + std::to_string(members.size()) + " of its " + std::to_string(all.size()) +
                      " tasks (the others were not evaluated)");
    }
  }
  return g;
}

nlohmann::json rows_with_macro_over(const std::vector<TaskResult>& results,
                                    const std::vector<std::pair<std::string, std::vector<std::string>>>& macro_over) {
  nlohmann::json rows = results_rows(results);
  for (auto& row : rows) {
    for (const auto& [group, members] : macro_over) {
      if (row["task"] == group && row["format"] == "gen") row["macro_over"] = members;
    }
  }
  return rows;
}

DownstreamPipeline::DownstreamPipeline(const DownstreamSelection& selection, DownstreamPlan plan, const NoteFn& note)
    : plan_(std::move(plan)) {
  for (const auto& v : plan_.variants) {
    files_.push_back(load_task(v.dir, v.task, v.format, v.shots, selection.limit));
    if (plan_.chat) {
      to_chat_format(files_.back());
    } else {
      require_plain_contexts(files_.back());
    }
  }
  const auto& tasks = plan_.generation_tasks;
  if (!selection.drop_dataset.empty() && std::find(tasks.begin(), tasks.end(), "drop") == tasks.end())
    throw Error("--drop-dataset gives drop's prompts, and this run does not evaluate drop");
  for (const auto& task : plan_.generation_tasks) {
    if (task == "drop" && !selection.drop_dataset.empty()) {
      generation_files_.push_back(load_drop_llama3(selection.drop_dataset, installed_variant(plan_.dirs, task),
                                                   selection.limit, plan_.chat, note));
      continue;
    }
    generation_files_.push_back(
        load_generation_task(find_generation_variant(plan_.dirs, task), task, selection.limit, plan_.chat));
    if (task == "drop" && plan_.chat) generation_files_.back().prompts_differ = kInstalledDropDiffers;
    if (selection.shots && *selection.shots != generation_files_.back().shots)
      say(note, task + ": its request files are rendered with " + std::to_string(generation_files_.back().shots) +
                    " shots (--shots applies to the multiple-choice tasks)");
  }
  // Code tasks need the sandbox: without it they fail now, not after the generation.
  for (const auto& task : plan_.generation_tasks) {
    if (runs_programs(task) && !sandbox_support().available)
      throw Error(task + " runs the generated programs, which needs the code sandbox: " + sandbox_support().reason);
  }
}

std::map<std::string, std::string> DownstreamPipeline::prompts_differ() const {
  std::map<std::string, std::string> out;
  for (const auto& f : generation_files_) {
    if (!f.prompts_differ.empty()) out[f.task] = f.prompts_differ;
  }
  return out;
}

std::vector<std::string> DownstreamPipeline::tasks_needing_external_scorers() const {
  std::vector<std::string> out;
  for (const auto& task : plan_.generation_tasks) {
    if (find_generation_task(task)->family->needs_external_scorer()) out.push_back(task);
  }
  return out;
}

void DownstreamPipeline::prepare(const Tokenizer& tokenizer, const ModelConfig& config, int64_t max_length) {
  const auto start = std::chrono::steady_clock::now();
  for (auto& f : files_) tasks_.push_back(prepare_task(std::move(f), tokenizer, config, max_length));
  files_.clear();
  prepare_seconds_ += seconds_since(start);
}

DownstreamResult DownstreamPipeline::run(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer,
                                         const DownstreamOptions& options) const {
  if (!files_.empty()) throw Error("DownstreamPipeline::run before prepare");
  const auto progress = [&](const char* what) {
    return options.phase_progress ? options.phase_progress(what) : ProgressFn{};
  };
  DownstreamResult r;
  const auto scoring_start = std::chrono::steady_clock::now();
  for (const auto& t : tasks_) r.requests += static_cast<int64_t>(t.requests.size());
  if (!tasks_.empty()) r.choice_results = evaluate_tasks(model, tasks_, options.score, progress("requests"));
  r.scoring_seconds = prepare_seconds_ + seconds_since(scoring_start);

  // Generation requests on the engine serve uses, then their metrics.
  const auto generation_start = std::chrono::steady_clock::now();
  r.answers =
      generate_answers(model, std::move(tokenizer), generation_files_, options.generation, progress("generations"));
  r.generation_seconds = seconds_since(generation_start);
  for (size_t t = 0; t < generation_files_.size(); ++t) {
    const auto& f = generation_files_[t];
    r.generation_shots.emplace_back(f.task, f.shots);
    for (size_t i = 0; i < f.requests.size(); ++i) {
      r.instances.push_back(
          {f.task, f.requests[i].doc_id, f.requests[i].native_id, r.answers[t][i].generation, f.requests[i].gold});
      r.truncated += r.answers[t][i].truncated;
    }
  }
  if (r.truncated > 0)
    say(options.note,
        std::to_string(r.truncated) + " generation contexts were left-truncated to fit (as lm-eval does)");
  try {
    if (!r.instances.empty())
      r.generation = score_and_aggregate(r.instances, r.generation_shots, options.scorers, options.note);
  } catch (const std::exception&) {
    if (options.save_unscored) {
      std::string text;
      size_t k = 0;
      for (size_t t = 0; t < generation_files_.size(); ++t) {
        for (size_t i = 0; i < generation_files_[t].requests.size(); ++i, ++k) {
          const auto& tokens = r.answers[t][i].prompt_tokens;
          nlohmann::json row = generation_row(r.instances[k], generation_files_[t].shots,
                                              std::vector<int64_t>(tokens.begin(), tokens.end()), InstanceMetrics{});
          row.erase("metrics");
          text += row.dump() + "\n";
        }
      }
      options.save_unscored(text);
    }
    throw;
  }
  return r;
}

void DownstreamPipeline::tabulate(DownstreamResult& r, std::vector<std::string>* notes) const {
  r.shown = with_group_results(plan_.choice_names, r.choice_results, notes);  // with the groups' rows
  r.shown.insert(r.shown.end(), r.generation.results.begin(), r.generation.results.end());
  if (plan_.suite) r.suite = suite_report(*plan_.suite, r.shown, prompts_differ());
}

std::string DownstreamPipeline::request_lines(const DownstreamResult& r) const {
  std::string text;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    for (const auto& row : request_rows(tasks_[t].files, r.choice_results[t])) text += row.dump() + "\n";
  }
  size_t k = 0;  // instances are in task, then request order
  for (size_t t = 0; t < generation_files_.size(); ++t) {
    const auto& f = generation_files_[t];
    for (size_t i = 0; i < f.requests.size(); ++i, ++k) {
      const GeneratedAnswer& answer = r.answers[t][i];
      nlohmann::json row = generation_row(
          r.instances[k], f.shots, std::vector<int64_t>(answer.prompt_tokens.begin(), answer.prompt_tokens.end()),
          r.generation.metrics[k]);
      if (f.requests[i].chat) {
        row["messages"] = f.requests[i].chat->messages;
        // The text the prompt ends with after the generation prompt ("" when none), so the rows show the whole
        // prompt OLMES' convert_chat_instance gives (run_eval.py:213).
        row["assistant_prefix"] = f.requests[i].chat->assistant_prefix;
      }
      row["truncated"] = answer.truncated;
      row["finish_reason"] = answer.finish_reason;
      row["generated_tokens"] = answer.generated_tokens;
      text += row.dump() + "\n";
    }
  }
  return text;
}

}  // namespace archspace
