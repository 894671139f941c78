#include "archspace/train/batches.h"

#include <cstdio>

#include "archspace/data/instance_loader.h"  // IndexPermutation
#include "archspace/util/error.h"

namespace archspace {

int64_t labelled_tokens(const Batch& batch) { return (batch.labels != kIgnoreIndex).sum().item<int64_t>(); }

std::string batch_hash(const at::Tensor& ids) {
  uint64_t h = 1469598103934665603ull;
  const at::Tensor c = ids.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Batch window_batch(const Instances& instances, uint64_t first, int64_t count) {
  at::Tensor ids = instances.batch(first, count);
  if (instances.label_tokens() > 0) {  // S + 1 ids: the first S are the input, the last S its labels (Megatron's)
    const int64_t S = instances.sequence_length();
    return {ids.narrow(1, 0, S).contiguous(), ids.narrow(1, 1, S).contiguous()};
  }
  at::Tensor labels = at::full_like(ids, kIgnoreIndex);
  labels.narrow(1, 0, ids.size(1) - 1).copy_(ids.narrow(1, 1, ids.size(1) - 1));
  return {ids, labels};
}

ChatBatches::ChatBatches(std::vector<ChatExample> examples, int64_t seq_len, int64_t pad_id, uint64_t seed,
                         bool shuffle)
    : examples_(std::move(examples)), seq_len_(seq_len), pad_id_(pad_id), seed_(seed), shuffle_(shuffle) {
  if (examples_.empty()) throw Error("chat batches: no examples");
}

Batch ChatBatches::batch(uint64_t first, int64_t count) const {
  at::Tensor ids = at::full({count, seq_len_}, pad_id_, at::kLong),
             labels = at::full({count, seq_len_}, kIgnoreIndex, at::kLong);
  auto id_a = ids.accessor<int64_t, 2>(), lab_a = labels.accessor<int64_t, 2>();
  const uint64_t n = examples_.size();
  for (int64_t b = 0; b < count; ++b) {
    const uint64_t index = first + b, epoch = index / n, pos = index % n;
    const ChatExample& ex = examples_[shuffle_ ? IndexPermutation(n, seed_ * 1000003 + epoch)(pos) : pos];
    const int64_t len = std::min<int64_t>(ex.ids.size(), seq_len_);
    for (int64_t t = 0; t < len; ++t) {
      id_a[b][t] = ex.ids[t];
      if (t + 1 < len && ex.trained[t + 1]) lab_a[b][t] = ex.ids[t + 1];
    }
  }
  return {ids, labels};
}

}  // namespace archspace
