// ifeval: prompt_level_loose_acc (primary), prompt_level_strict_acc, inst_level_loose_acc, inst_level_strict_acc:
// lm-eval's IFEval checks (the code OLMES' IFEvalMetric runs from its copy), run by the caller's InstructionCheck.
// Gold: the doc's key, prompt, instruction_id_list and kwargs. Per instance an inst_level value is the fraction of
// its instructions followed; the task's is over all instructions pooled (OLMES' aggregate_to_task, lm-eval's
// agg_inst_level_acc), with no standard error (neither reports one).
#include <algorithm>
#include <limits>

#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"

namespace archspace::task_families {
namespace {

class IfEval final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    return {{"ifeval",
             "",
             {"prompt_level_loose_acc", "prompt_level_strict_acc", "inst_level_loose_acc", "inst_level_strict_acc"},
             "prompt_level_loose_acc"}};
  }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    const auto bad = [&](const std::string& what) {
      throw Error("field \"gold\" must be an IFEval doc: " + what + " (task " + spec.task + ")");
    };
    if (!gold.is_object()) bad("an object");
    if (!gold.contains("instruction_id_list") || !all_strings(gold["instruction_id_list"]))
      bad("instruction_id_list, a non-empty list of strings");
    if (!gold.contains("kwargs") || !gold["kwargs"].is_array() ||
        gold["kwargs"].size() != gold["instruction_id_list"].size() ||
        !std::all_of(gold["kwargs"].begin(), gold["kwargs"].end(), [](const auto& k) { return k.is_object(); }))
      bad("kwargs, a list of objects, one per instruction");
    if (!gold.contains("prompt") || !gold["prompt"].is_string()) bad("prompt, a string");
  }
  // The doc's fields the checks read.
  nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& line) const override {
    const nlohmann::json* doc =
        line.is_object() && line.contains("doc") && line["doc"].is_object() ? &line["doc"] : nullptr;
    if (!doc) throw Error("missing field \"doc\" (the IFEval instructions of task ifeval)");
    nlohmann::json g = nlohmann::json::object();
    for (const char* key : {"key", "prompt", "instruction_id_list", "kwargs"}) {
      if (!doc->contains(key)) throw Error(std::string("missing field \"doc.") + key + "\" (task ifeval)");
      g[key] = (*doc)[key];
    }
    try {
      check_gold(spec, g);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc\": ") + e.what());
    }
    return g;
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers& scorers,
             const std::vector<InstanceMetrics*>& out) const override {
    if (batch.empty()) return;
    if (!scorers.instructions) throw Error("IFEval responses need the instruction checks, and none were given");
    std::vector<std::pair<nlohmann::json, std::string>> pairs;
    for (const GenerationInstance* x : batch) pairs.emplace_back(x->gold, x->generation);
    const std::vector<InstructionResult> results = scorers.instructions(pairs);
    if (results.size() != pairs.size())
      throw Error("the instruction checks answered " + std::to_string(results.size()) + " responses for " +
                  std::to_string(pairs.size()));
    for (size_t k = 0; k < batch.size(); ++k) {
      const InstructionResult& r = results[k];
      const size_t n = batch[k]->gold["instruction_id_list"].size();
      if (r.inst_strict.size() != n || r.inst_loose.size() != n)
        throw Error("the instruction checks answered " + std::to_string(r.inst_strict.size()) + " instructions for " +
                    std::to_string(n) + " (ifeval document " + batch[k]->doc_id.dump() + ")");
      const auto fraction = [n](const std::vector<bool>& b) {
        return static_cast<double>(std::count(b.begin(), b.end(), true)) / static_cast<double>(n);
      };
      InstanceMetrics& m = *out[k];
      set_metric(m, "prompt_level_loose_acc", r.prompt_loose ? 1.0 : 0.0);
      set_metric(m, "prompt_level_strict_acc", r.prompt_strict ? 1.0 : 0.0);
      set_metric(m, "inst_level_loose_acc", fraction(r.inst_loose));
      set_metric(m, "inst_level_strict_acc", fraction(r.inst_strict));
      m.scoring_errors.insert(m.scoring_errors.end(), r.scoring_errors.begin(), r.scoring_errors.end());
    }
  }
  ExternalScorer external_scorer() const override { return ExternalScorer::instruction_checks; }
  // inst_level: over all instructions pooled, each document's fraction weighing its number of instructions.
  MetricValue aggregate(const std::string& metric, const std::vector<const GenerationInstance*>& instances,
                        const std::vector<double>& values) const override {
    MetricValue v = GenerationTaskFamily::aggregate(metric, instances, values);
    if (metric.rfind("inst_level", 0) != 0) return v;
    double followed = 0, total = 0;
    for (size_t i = 0; i < instances.size(); ++i) {
      const auto n = static_cast<double>(instances[i]->gold["instruction_id_list"].size());
      followed += values[i] * n;
      total += n;
    }
    v.value = followed / total;
    v.stderr_ = std::numeric_limits<double>::quiet_NaN();
    return v;
  }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(ifeval, IfEval, 50)

}  // namespace archspace::task_families
