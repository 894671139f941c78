// The training loop of one pipeline stage: AdamW, cosine schedule with warm-up, gradient accumulation
// and clipping, z-loss, metrics (metrics.jsonl), progress, validation, atomic checkpoints, exact resume.
// Written for one process; the data side is already rank-aware (InstanceLoader::rank_batch) so that a
// data-parallel wrapper can split each global batch without changing what is computed.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "archspace/config/train_config.h"

namespace archspace {

struct TrainOptions {
  bool resume = false;
  bool progress = true;
  int64_t stop_after_step = 0;  // >0: stop after this step as if interrupted (tests of resume)
};

struct TrainResult {
  std::vector<double> losses;  // per step run in this call
  std::string final_checkpoint;
};

TrainResult run_training(const TrainConfig& config, const TrainOptions& options);

// Sums over labelled positions (labels != -100): cross-entropy, z-loss (coeff * logsumexp^2), count.
struct LossSums {
  at::Tensor ce_sum, z_sum;
  int64_t count;
};
LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff);

}  // namespace archspace
