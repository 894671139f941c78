// The data of a pretraining run (data.format = "tokens"): the training instances (one token source,
// data.train, or a weighted mixture, [[data.sources]]), the validation sets (data.valid and each of
// [[eval.sources]]), and the tokenizer its checkpoints carry. Every source is checked against the model's
// vocabulary, and (on the rank that checks) once per content against its checksums.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/config/train_config.h"
#include "archspace/data/instance_loader.h"
#include "archspace/data/instances.h"
#include "archspace/util/progress.h"

namespace archspace {

// A validation set and the metrics.jsonl key of its loss: "valid_loss" (data.valid), "valid/NAME/loss".
struct ValidationSet {
  std::string metric;
  std::shared_ptr<const InstanceLoader> instances;  // in storage order
};

struct TokenData {
  std::shared_ptr<const Instances> train;
  std::vector<ValidationSet> valid;
  std::string tokenizer_file;  // "" : none (tokenizer_note says why)
  std::string tokenizer_note;
  // A mixture's realised shares (RUN/data_mixture.json) and what a checkpoint records of it to refuse a
  // resume under another mixture; null without a mixture.
  nlohmann::json mixture, mixture_fingerprint;
  // train.document_masking: the EOS id that ends the documents of every source (its manifest's, or for files
  // without one the model's, as the data reader takes it); -1 without document masking.
  int64_t document_eos = -1;
};

// `global_batch`: instances per step over every rank (a mixture's schedule is laid out in global batches).
// `verify`: run the once-per-content checks (rank 0), noting each full check on `progress`.
TokenData open_token_data(const TrainConfig& cfg, const ModelConfig& model, int64_t global_batch, bool verify,
                          ProgressLine& progress);

}  // namespace archspace
