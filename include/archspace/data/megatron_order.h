// Training instances in Megatron-Core's GPTDataset order (train.data_order = "megatron"; data/megatron_samples.h) from
// a Megatron indexed dataset, its sequences as the documents (Megatron's train split with --split 100,0,0). Each
// instance holds sequence_length + 1 ids, the last one only a label, as Megatron's samples do
// (add_extra_token_to_sequence); the run's instances are its num_samples = train.max_steps x global batch, Megatron's
// train_iters x global_batch_size, from which the number of epochs and so the order follow.
#pragma once

#include <memory>
#include <vector>

#include "archspace/data/instances.h"
#include "archspace/data/megatron_samples.h"
#include "archspace/data/token_shards.h"

namespace archspace {

class MegatronOrderInstances : public Instances {
 public:
  // `shards`: a Megatron dataset as open_megatron_dataset opens it (one shard, the .bin), `document_lengths` its
  // sequence lengths (megatron_sequence_lengths).
  MegatronOrderInstances(std::shared_ptr<const TokenShards> shards, const std::vector<int32_t>& document_lengths,
                         int64_t sequence_length, uint64_t num_samples, uint64_t seed);

  uint64_t instances_per_epoch() const override { return num_samples_; }  // the run reads each once
  int64_t sequence_length() const override { return sequence_length_; }
  int64_t label_tokens() const override { return 1; }
  std::vector<uint32_t> instance(uint64_t index) const override;  // sequence_length + 1 ids

  const MegatronSampleIndex& index() const { return index_; }

 private:
  std::shared_ptr<const TokenShards> shards_;
  int64_t sequence_length_;
  uint64_t num_samples_;
  MegatronSampleIndex index_;
  std::vector<int32_t> lengths_;
  std::vector<uint64_t> starts_;  // each document's first token in the .bin
};

}  // namespace archspace
