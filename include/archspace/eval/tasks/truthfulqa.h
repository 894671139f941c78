// The truthfulqa family's document labels and scoring (src/eval/tasks/truthfulqa.cpp), exposed for its unit tests.
//
// TruthfulQA (several true choices per document) as OLMES' truthfulqa writes it: each line's doc carries the
// document's choices' 0/1 `labels`, `mc1_indices` and `mc2_indices` (OLMES' TruthfulQA._process_doc merges the
// mc1_targets and mc2_targets choices into one list; `idx` indexes it); lm-eval's form, doc.mc2_targets.labels with
// one request per MC2 choice, is read too (MC2 over every choice, no MC1). Such a task is scored by OLMES'
// MC1MC2Accuracy, its requests' `label` not used.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "archspace/eval/task_files.h"

namespace archspace {

// One TruthfulQA document's labels; as requests-out rows carry them: {"labels", "mc1_indices", "mc2_indices"}.
struct MultiTrueLabels final : DocumentLabels {
  MultiTrueLabels() = default;
  MultiTrueLabels(std::vector<int64_t> labels, std::vector<int64_t> mc1, std::vector<int64_t> mc2)
      : labels(std::move(labels)), mc1_indices(std::move(mc1)), mc2_indices(std::move(mc2)) {}
  std::vector<int64_t> labels;       // per choice (idx), 1 true, 0 false
  std::vector<int64_t> mc1_indices;  // the choices MC1 ranks (empty: no MC1)
  std::vector<int64_t> mc2_indices;  // the choices MC2 weighs (lm-eval's form: every choice, filled by fit_choices)

  void fit_choices(int64_t choices) override;
  nlohmann::json to_json() const override;
};

// OLMES' MC1MC2Accuracy on one document: (mc1, mc2) from its choices' log-likelihoods by idx.
std::pair<double, double> truthfulqa_mc1_mc2(const MultiTrueLabels& labels, const std::map<int64_t, double>& ll);

}  // namespace archspace
