#include "archspace/train/embedding_gradient.h"

#include <ATen/core/grad_mode.h>

#include "archspace/util/error.h"

namespace archspace {

EmbeddingGradient::EmbeddingGradient(const at::Tensor& table) : table_(table) {
  if (!table.requires_grad()) throw Error("EmbeddingGradient: the embedding table does not require grad");
  table_.mutable_grad() = at::zeros_like(table_);
  table_.register_hook(&EmbeddingGradient::sum_rows_in_order);
}

void EmbeddingGradient::will_touch(const at::Tensor& ids) { touched_.push_back(ids.reshape({-1})); }

void EmbeddingGradient::zero() {
  c10::NoGradGuard no_grad;
  if (!touched_.empty()) table_.mutable_grad().index_fill_(0, at::cat(touched_).to(table_.device()), 0);
  touched_.clear();
}

at::Tensor EmbeddingGradient::touched_rows() const {
  if (touched_.empty()) return at::empty({0}, at::kLong);
  return std::get<0>(at::_unique2(at::cat(touched_).to(at::kCPU, at::kLong), /*sorted=*/true));
}

at::Tensor EmbeddingGradient::sum_rows_in_order(const at::Tensor& grad) {
  if (!grad.is_sparse()) return grad;
  c10::NoGradGuard no_grad;
  const at::Tensor ids = grad._indices().reshape({-1}), rows = grad._values();
  const auto [distinct, slot, counts] = at::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true);
  // index_add_ on the CPU adds the source rows one by one in index order: each sum starts at zero and takes
  // its rows in token order.
  const at::Tensor sums = at::zeros({distinct.size(0), rows.size(1)}, rows.options()).index_add_(0, slot, rows);
  return at::_sparse_coo_tensor_unsafe(distinct.unsqueeze(0), sums, grad.sizes())._coalesced_(true);
}

}  // namespace archspace
