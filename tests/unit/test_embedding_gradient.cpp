// The embedding gradient kept across steps (train/embedding_gradient.h): the sparse lookup's rows summed in
// token order and added to the kept dense gradient give ATen's dense backward bit for bit, over several
// micro-batches with repeated ids; zero() leaves the whole gradient zero by touching only the step's rows.
#include <gtest/gtest.h>

#include "archspace/train/embedding_gradient.h"

namespace archspace {
namespace {

// The gradient of sum(lookup(ids) * weights) over `batches` micro-batches, each its own backward.
at::Tensor accumulate(at::Tensor& table, const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& upstream,
                      bool sparse) {
  for (size_t m = 0; m < ids.size(); ++m)
    (at::embedding(table, ids[m], -1, false, sparse) * upstream[m]).sum().backward();
  return table.grad().clone();
}

TEST(EmbeddingGradient, SparseRowsInTokenOrderEqualTheDenseBackward) {
  const int64_t V = 50, d = 24;
  at::manual_seed(0);
  at::Tensor dense_table = at::randn({V, d}).requires_grad_(true);
  at::Tensor sparse_table = dense_table.detach().clone().requires_grad_(true);
  EmbeddingGradient kept(sparse_table);
  for (int step = 0; step < 3; ++step) {
    std::vector<at::Tensor> ids, upstream;
    for (int m = 0; m < 3; ++m) {
      // Few distinct ids: most rows are summed from several tokens, within and across micro-batches.
      ids.push_back(at::randint(8, {2, 37}, at::kLong));
      upstream.push_back(at::randn({2, 37, d}) * 1e3);  // large and mixed: a change of summation order shows
    }
    dense_table.mutable_grad().reset();
    for (const at::Tensor& i : ids) kept.will_touch(i);
    const at::Tensor expected = accumulate(dense_table, ids, upstream, false);
    const at::Tensor got = accumulate(sparse_table, ids, upstream, true);
    EXPECT_EQ(got.layout(), at::kStrided);
    EXPECT_TRUE(at::equal(got, expected)) << "step " << step << ": max difference " << (got - expected).abs().max();
    kept.zero();
    EXPECT_EQ(sparse_table.grad().abs().max().item<float>(), 0.0f) << "step " << step;
  }
}

TEST(EmbeddingGradient, AnotherSummationOrderIsCaught) {
  // The check above can fail: the same rows added one by one into the kept sum (no per-micro-batch sums first)
  // differ from the dense backward at this scale.
  const int64_t V = 50, d = 24;
  at::manual_seed(1);
  at::Tensor table = at::randn({V, d}).requires_grad_(true);
  std::vector<at::Tensor> ids, upstream;
  for (int m = 0; m < 3; ++m) {
    ids.push_back(at::randint(8, {2, 37}, at::kLong));
    upstream.push_back(at::randn({2, 37, d}) * 1e3);
  }
  const at::Tensor expected = accumulate(table, ids, upstream, false);
  at::Tensor one_by_one = at::zeros({V, d});
  for (size_t m = 0; m < ids.size(); ++m) one_by_one.index_add_(0, ids[m].reshape({-1}), upstream[m].reshape({-1, d}));
  EXPECT_FALSE(at::equal(one_by_one, expected));
}

TEST(EmbeddingGradient, DenseGradientsPassUnchanged) {
  const at::Tensor g = at::randn({5, 3});
  EXPECT_TRUE(EmbeddingGradient::sum_rows_in_order(g).is_same(g));
}

}  // namespace
}  // namespace archspace
