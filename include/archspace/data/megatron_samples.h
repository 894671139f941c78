// Megatron-Core's GPTDataset sample order (megatron/core/datasets/gpt_dataset.py, _build_document_sample_shuffle_
// indices; helpers.cpp, build_sample_idx), for train.data_order = "megatron". Megatron reads a run's training data as
// num_samples samples of sequence_length + 1 tokens (the last one only a label) cut from the documents laid end to end
// in a shuffled order, one document list per epoch:
//   epochs      as many as the samples need: tokens_per_epoch x epochs >= num_samples x S + 1;
//   documents   [0, n) once per epoch, shuffled by numpy.random.RandomState(seed); when the last epoch is needed for
//               fewer than 80% of an epoch's samples ("separate final epoch"), the epochs before it are shuffled
//               together and the last one on its own, so that its few samples are not spread over the whole run;
//   samples     build_sample_idx: sample i starts where sample i-1's S tokens ended (the extra token overlaps);
//   order       the samples shuffled by the same RandomState (the final epoch's, when separate, on their own after).
// Standard C++ only (with data/numpy_random.h), so that the test tool builds without LibTorch.
#pragma once

#include <cstdint>
#include <vector>

namespace archspace {

struct MegatronSampleIndex {
  int32_t epochs = 0;
  bool separate_final_epoch = false;
  std::vector<int32_t> document_index;  // document ids, epoch after epoch, shuffled
  // (position in document_index, token offset in that document) where each sample starts; samples + 1 of them.
  std::vector<int64_t> sample_document, sample_offset;
  std::vector<uint64_t> shuffle_index;  // the sample each training instance reads
};

// The index GPTDataset builds for `num_samples` samples of `sequence_length` (+1 with add_extra_token) tokens from
// documents of these lengths with config.random_seed `seed`. Throws archspace::Error for what Megatron asserts
// (sequence_length > 1, more than one token, a seed numpy accepts).
MegatronSampleIndex build_megatron_sample_index(const std::vector<int32_t>& document_lengths, int32_t sequence_length,
                                                uint64_t num_samples, uint64_t seed, bool add_extra_token = true);

}  // namespace archspace
