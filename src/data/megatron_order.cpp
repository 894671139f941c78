#include "archspace/data/megatron_order.h"

#include <string>

#include "archspace/util/error.h"

namespace archspace {

MegatronOrderInstances::MegatronOrderInstances(std::shared_ptr<const TokenShards> shards,
                                               const std::vector<int32_t>& document_lengths, int64_t sequence_length,
                                               uint64_t num_samples, uint64_t seed)
    : shards_(std::move(shards)),
      sequence_length_(sequence_length),
      num_samples_(num_samples),
      index_(build_megatron_sample_index(document_lengths, static_cast<int32_t>(sequence_length), num_samples, seed)),
      lengths_(document_lengths) {
  if (shards_->num_shards() != 1) throw Error(shards_->dir() + ": the megatron order reads one Megatron dataset");
  starts_.reserve(lengths_.size());
  uint64_t start = 0;
  for (int32_t n : lengths_) {
    starts_.push_back(start);
    start += static_cast<uint64_t>(n);
  }
  if (start != shards_->shard_tokens(0))
    throw Error(shards_->dir() + ": its sequence lengths sum to " + std::to_string(start) + " tokens, its data holds " +
                std::to_string(shards_->shard_tokens(0)));
}

std::vector<uint32_t> MegatronOrderInstances::instance(uint64_t index) const {
  if (index >= num_samples_) {
    throw Error("instance " + std::to_string(index) + " of a run whose Megatron order holds " +
                std::to_string(num_samples_) +
                " samples (train.max_steps x global batch, as Megatron's train_iters x global_batch_size)");
  }
  const uint64_t sample = index_.shuffle_index[index];
  int64_t position = index_.sample_document[sample], offset = index_.sample_offset[sample];
  const int64_t end_position = index_.sample_document[sample + 1], end_offset = index_.sample_offset[sample + 1];
  std::vector<uint32_t> ids(static_cast<size_t>(sequence_length_ + 1));
  size_t filled = 0;
  // _query_document_sample_shuffle_indices: from (position, offset) to the end document's end_offset + 1 (the extra
  // token), across the documents between.
  for (; position <= end_position; ++position, offset = 0) {
    const int32_t document = index_.document_index[position];
    const int64_t stop = position == end_position ? end_offset + 1 : lengths_[document];
    const uint64_t n = static_cast<uint64_t>(stop - offset);
    if (filled + n > ids.size()) throw Error("megatron order: sample " + std::to_string(sample) + " overruns");
    shards_->read(0, starts_[document] + static_cast<uint64_t>(offset), n, ids.data() + filled);
    filled += n;
  }
  if (filled != ids.size())
    throw Error("megatron order: sample " + std::to_string(sample) + " holds " + std::to_string(filled) + " tokens");
  return ids;
}

}  // namespace archspace
