#include "archspace/train/context_parallelism.h"

#include <algorithm>
#include <vector>

#include "archspace/dist/sequence_exchange.h"
#include "archspace/util/error.h"

namespace archspace {

ContextParallelism::ContextParallelism(DistGroup& world, int64_t degree, int64_t sequence_length)
    : degree_(degree), slice_length_(sequence_length / degree) {
  if (degree < 1 || world.world_size() % degree != 0 || sequence_length % degree != 0)
    throw Error("context parallelism of degree " + std::to_string(degree) + " over " +
                std::to_string(world.world_size()) + " ranks and sequences of " + std::to_string(sequence_length) +
                " tokens: the degree must divide both");
  const int64_t rank = world.rank();
  data_parallel_rank_ = rank / degree;
  data_parallel_size_ = world.world_size() / degree;
  std::vector<int> members;
  for (int64_t r = data_parallel_rank_ * degree; r < (data_parallel_rank_ + 1) * degree; ++r)
    members.push_back(static_cast<int>(r));
  group_ = world.subgroup(members, "context-parallel " + std::to_string(data_parallel_rank_));
  slice_start_ = group_->rank() * slice_length_;
}

Batch ContextParallelism::slice(const Batch& batch) const {
  if (batch.input_ids.size(1) != slice_length_ * degree_)
    throw Error("context parallelism: a batch of " + std::to_string(batch.input_ids.size(1)) + " positions, expected " +
                std::to_string(slice_length_ * degree_));
  return {batch.input_ids.narrow(1, slice_start_, slice_length_).contiguous(),
          batch.labels.narrow(1, slice_start_, slice_length_).contiguous()};
}

ContextParallel::Keys ContextParallelism::attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t window) {
  constexpr int64_t kSeq = 2;  // [B, G, T, h]
  // Keys and values travel together, one exchange per layer: every rank then runs the same collectives in
  // the same order in backward too, whatever order autograd reaches k and v in. Under autocast Depth-Attention's
  // mix may be fp32 beside bf16 keys: both go as fp32 (exact for the keys; attention casts them back as it
  // would have) and their gradients are summed in fp32.
  const at::ScalarType dtype = at::promote_types(k.scalar_type(), v.scalar_type());
  auto exchange = [&](auto&& fn) -> std::pair<at::Tensor, at::Tensor> {
    std::vector<at::Tensor> kv = fn(at::stack({k.to(dtype), v.to(dtype)}), kSeq + 1).unbind(0);
    return {kv[0], kv[1]};
  };
  if (window > 0) {
    // A query at position i sees keys i - window < j <= i: the slice needs the window - 1 positions before it.
    auto [keys, values] =
        exchange([&](const at::Tensor& t, int64_t dim) { return gather_preceding(*group_, t, dim, window - 1); });
    return {keys, values, keys.size(kSeq) - slice_length_};
  }
  // Full attention: every earlier position. Positions after the slice are gathered too (one collective of
  // equal shares) but not attended to: narrowed away, their gradient is zero.
  auto [keys, values] = exchange([&](const at::Tensor& t, int64_t dim) { return gather_sequence(*group_, t, dim); });
  const int64_t end = slice_start_ + slice_length_;
  return {keys.narrow(kSeq, 0, end), values.narrow(kSeq, 0, end), slice_start_};
}

}  // namespace archspace
