// The embedding table's gradient in one process without a [V, d] zero fill per step. ATen's dense lookup
// backward allocates a zeroed [V, d] gradient and adds the T looked-up rows into it: at V = 100,278 that fill
// is the largest write of a small model's step. Here the gradient stays allocated from step to step; the
// lookup (SequenceOptions::sparse_embedding_gradient) hands autograd its rows as a sparse gradient, which a
// hook on the table sums per row in token order (what the dense backward does) before autograd adds it to the
// dense gradient; after the optimizer step only the rows the step touched are zeroed.
//
// The values are the dense path's bit for bit: a micro-batch's row sums are formed from zero in token order
// as embedding_dense_backward forms them, and added once to the sum of the earlier micro-batches, as autograd
// adds a dense gradient. CPU only (CUDA's index_add is not ordered) and not under data-parallel reducers,
// whose buckets take dense gradients.
#pragma once

#include <ATen/ATen.h>

namespace archspace {

class EmbeddingGradient {
 public:
  // Allocates `table`'s dense gradient (zeros, once) and hooks `table` (a leaf that requires grad).
  explicit EmbeddingGradient(const at::Tensor& table);
  // The token ids the step's lookups read (before its backward).
  void will_touch(const at::Tensor& ids);
  // Zeroes the rows touched since the last call (the only nonzero ones), instead of dropping the gradient.
  void zero();
  // The rows touched since the last zero(), sorted and distinct (int64, CPU): every row of the gradient that
  // may be nonzero, for clipping to read and scale only those (kernels/gradient_norm.h).
  at::Tensor touched_rows() const;

  // The hook: a sparse [V, d] gradient of looked-up rows (duplicates in token order) as one row sum per
  // distinct id, each formed from zero in token order; dense gradients pass unchanged.
  static at::Tensor sum_rows_in_order(const at::Tensor& grad);

 private:
  at::Tensor table_;
  std::vector<at::Tensor> touched_;
};

}  // namespace archspace
