// The language-model loss: next-token cross-entropy plus z-loss as sums over the labelled positions (so
// gradient accumulation can divide by the labelled-token count of the whole global batch), and the
// per-token log-probabilities evaluation and scoring read. One module for the Trainer, `eval ppl`,
// `analyze` and scoring (it sits in model/, the lowest layer all of them reach).
//
// The output head's logits [N, V] are the largest activation of a long sequence (65,536 tokens x 100,278
// ids x 4 bytes = 24.5 GiB), so head_loss and label_logprobs take the head's input h [N, D] and weight
// W [V, D] and compute the logits a chunk of rows at a time: memory O(chunk x V), never [N, V].
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace archspace {

constexpr int64_t kIgnoreIndex = -100;  // label of positions without loss (as torch's cross_entropy)

// Sums over labelled positions (labels != -100): cross-entropy, z-loss (coeff * logsumexp^2), count.
struct LossSums {
  at::Tensor ce_sum, z_sum;  // 0-dim fp32 (fp64 for fp64 inputs)
  int64_t count = 0;
};

// From logits [..., V] (cast to fp32) and labels [...]: the unchunked form.
LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff);

// The head and the loss in one: the sums of next_token_loss(hidden W^T, labels), differentiable in hidden and
// head_weight, computed chunk_tokens labelled rows at a time when there are more rows than that (0: the
// unchunked form). The chunked form is one autograd node (loss.cpp): forward keeps h (in the
// matmul dtype), the labelled rows' labels and log-sum-exps, and backward recomputes each chunk's logits to
// form its gradient (one more head matmul than the unchunked form, the price of never holding [N, V]).
// Under bf16 autocast it casts as the unchunked form's linear does (h and W to bf16, logits bf16 then fp32);
// `head_weight_cast`, when given in that dtype, is head_weight already cast (train/weight_casts.h: once per
// optimizer step) and is used instead of a cast of its own. The gradient still goes to head_weight, in its dtype.
// `pad_rows_to`: the chunked form's matmuls run on the weight padded with zero rows to a multiple of this (the
// same logits for the real ids; the padded ones never count): kHeadPaddingForDevice picks
// kCudaHeadRowMultiple on CUDA, where an odd vocabulary (100,278) keeps cuBLAS off its aligned kernels, and
// none (1) on the CPU, whose one-pass cross-entropy kernel reads the unpadded logits.
constexpr int64_t kHeadPaddingForDevice = -1;
constexpr int64_t kCudaHeadRowMultiple = 128;  // 100,278 -> 100,352, the presets' padded_vocab_size
// The rows the chunked form's matmuls run on: `vocab` rounded up to a multiple of `pad_rows_to` (>= 1).
inline int64_t padded_head_rows(int64_t vocab, int64_t pad_rows_to) {
  return (vocab + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
}
LossSums head_loss(const at::Tensor& hidden, const at::Tensor& head_weight, const at::Tensor& labels,
                   double z_loss_coeff, int64_t chunk_tokens, const at::Tensor& head_weight_cast = {},
                   int64_t pad_rows_to = kHeadPaddingForDevice);

// For callers that need more of a chunk's distribution than the label's log-probability (argmax, top-k):
// rows [first_row, first_row + logprobs.size(0)) of hidden, their fp32 log-softmax [rows, V]. Nothing of it
// is kept after the call returns.
using LogprobChunkVisitor = std::function<void(int64_t first_row, const at::Tensor& logprobs)>;

// Without autograd: log p(labels[i] | row i) for each row of hidden [N, D] under the head, fp32 [N] (0 where
// labels[i] < 0: rows without a label, e.g. a next-token row only a visitor reads), chunk_rows rows at a
// time, each chunk's log-probabilities handed to `visit` when given. The logits are the model's head
// (kernels/linear.h) in its dtype, then fp32, as CausalLM::head gives them. `pad_rows_to` as head_loss's: on
// CUDA the head's matmul runs on the weight padded with zero rows (one copy a call) and the logits are read
// through their first V columns, so the visitor still sees [rows, V].
at::Tensor label_logprobs(const at::Tensor& hidden, const at::Tensor& head_weight, const at::Tensor& labels,
                          int64_t chunk_rows, const LogprobChunkVisitor& visit = nullptr,
                          int64_t pad_rows_to = kHeadPaddingForDevice);

}  // namespace archspace
