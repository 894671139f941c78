// The truthfulqa family's own functions (src/eval/tasks/truthfulqa.cpp), exposed for `archspace compare`, which
// scores each document from its requests-out rows as `eval downstream` scores it.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "archspace/eval/tasks.h"

namespace archspace {

// OLMES' MC1MC2Accuracy on one document: (mc1, mc2) from its choices' log-likelihoods by idx.
std::pair<double, double> truthfulqa_mc1_mc2(const MultiTrueLabels& labels, const std::map<int64_t, double>& ll);

}  // namespace archspace
