// The training loss: next-token cross-entropy plus z-loss, as sums over the labelled positions, so that
// gradient accumulation can divide by the labelled-token count of the whole global batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace archspace {

// Sums over labelled positions (labels != -100): cross-entropy, z-loss (coeff * logsumexp^2), count.
struct LossSums {
  at::Tensor ce_sum, z_sum;
  int64_t count;
};
LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff);

}  // namespace archspace
