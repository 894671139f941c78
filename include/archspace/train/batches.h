// Training batches: input ids and next-token labels, for pretraining windows (token shards) and for SFT
// chat examples. Batch k of a run is a pure function of (data, seed, k), which is what makes resume exact.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "archspace/chat/chat.h"
#include "archspace/data/instances.h"
#include "archspace/model/loss.h"  // kIgnoreIndex

namespace archspace {

struct Batch {
  at::Tensor input_ids;  // [B, T] int64
  at::Tensor labels;     // [B, T] int64, kIgnoreIndex where no loss
};

// Labelled positions of a batch (the loss normaliser).
int64_t labelled_tokens(const Batch& batch);

// FNV-1a over the token ids, as 16 hex digits: lets two runs show they saw the very same batches.
std::string batch_hash(const at::Tensor& ids);

// Instances [first, first + count) of a run, as one batch.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch batch(uint64_t first, int64_t count) const = 0;
  // The named sources of instances [first, first + count) and their instance counts (a mixture's); empty
  // for data of one source.
  virtual std::vector<std::pair<std::string, int64_t>> source_counts(uint64_t first, int64_t count) const {
    (void)first;
    (void)count;
    return {};
  }
};

// Pretraining windows: inputs are the window, labels the window shifted left (last position unlabelled).
Batch window_batch(const Instances& instances, uint64_t first, int64_t count);

// Windows of one shard set (InstanceLoader) or of a mixture of sources (SourceMixture).
class WindowBatches : public BatchSource {
 public:
  explicit WindowBatches(std::shared_ptr<const Instances> instances) : instances_(std::move(instances)) {}
  Batch batch(uint64_t first, int64_t count) const override { return window_batch(*instances_, first, count); }
  std::vector<std::pair<std::string, int64_t>> source_counts(uint64_t first, int64_t count) const override {
    return instances_->source_counts(first, count);
  }

 private:
  std::shared_ptr<const Instances> instances_;
};

// SFT examples, padded with `pad_id` or cut to `seq_len`; loss only where the example marks a trained
// token (assistant content and its end token). With `shuffle`, each epoch is a keyed permutation.
class ChatBatches : public BatchSource {
 public:
  ChatBatches(std::vector<ChatExample> examples, int64_t seq_len, int64_t pad_id, uint64_t seed, bool shuffle);
  Batch batch(uint64_t first, int64_t count) const override;
  size_t size() const { return examples_.size(); }

 private:
  std::vector<ChatExample> examples_;
  int64_t seq_len_, pad_id_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace archspace
