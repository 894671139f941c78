#include "archspace/train/token_data.h"

#include "archspace/data/instance_loader.h"
#include "archspace/data/megatron_dataset.h"
#include "archspace/data/megatron_order.h"
#include "archspace/data/source_mixture.h"
#include "archspace/data/token_source.h"
#include "archspace/train/run_tokenizer.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

// Every source of the run must fit the model's vocabulary and, where the files name their tokenizer, share
// the first one's (`first_sha` is set by the first source that names one).
void check_source(const TokenShards& source, const std::string& what, const TrainConfig& cfg, const ModelConfig& model,
                  std::string& first_sha, bool verify, ProgressLine& progress) {
  const ShardManifest& m = source.manifest();
  if (m.vocab_size > model.vocab_size) {
    throw Error(cfg.source + ": tokenizer/model vocabulary mismatch: " + what + " was tokenized with " +
                m.tokenizer_name + " (" + std::to_string(m.vocab_size) + " ids) but the model has vocab_size " +
                std::to_string(model.vocab_size));
  }
  // (Files without a manifest name no tokenizer; their vocabulary is checked against the model's.)
  if (!m.tokenizer_sha256.empty()) {
    if (first_sha.empty()) first_sha = m.tokenizer_sha256;
    if (m.tokenizer_sha256 != first_sha)
      throw Error(cfg.source + ": " + what + " was tokenized with another tokenizer than the run's other data");
  }
  // Damaged or edited files must not train silently: the full check runs once per content (cached).
  if (verify && source.verify_cached()) progress.note("verified " + what + " (SHA-256 of every shard)");
}

// train.document_masking: every source must name the EOS that ends its documents, and the same one.
void check_document_eos(const TokenShards& source, const std::string& what, const TrainConfig& cfg,
                        int64_t& document_eos) {
  if (!cfg.document_masking) return;
  const int64_t eos = source.manifest().eos_token_id;
  if (eos < 0) {
    throw Error(cfg.source + ": key 'train.document_masking' needs the EOS id that ends each document, and neither " +
                what + " nor the model's config.json (eos_token_id) names one");
  }
  if (document_eos >= 0 && eos != document_eos) {
    throw Error(cfg.source + ": key 'train.document_masking': " + what + " ends its documents with EOS id " +
                std::to_string(eos) + ", the run's other data with " + std::to_string(document_eos));
  }
  document_eos = eos;
}

}  // namespace

namespace {

// The run's instances from one source: windows in the engine's or OLMo-core's order, or Megatron's samples (which
// need a Megatron dataset: its sequences are the documents the order is made of).
std::shared_ptr<const Instances> train_instances(const std::shared_ptr<const TokenShards>& shards,
                                                 const TrainConfig& cfg, int64_t global_batch) {
  if (cfg.data_order != DataOrder::kMegatron)
    return std::make_shared<InstanceLoader>(shards, cfg.sequence_length, cfg.seed, cfg.shuffle, cfg.data_order,
                                            global_batch);
  if (detect_token_format(cfg.train_data) != TokenFormat::kMegatron) {
    throw Error(cfg.source + ": train.data_order = \"megatron\" reads a Megatron indexed dataset (PREFIX.bin + " +
                "PREFIX.idx: `archspace tokenize --format megatron` writes one), but data.train " + cfg.train_data +
                " is in the " + token_format_name(*detect_token_format(cfg.train_data)) + " format");
  }
  return std::make_shared<MegatronOrderInstances>(shards, megatron_sequence_lengths(shards->dir()), cfg.sequence_length,
                                                  static_cast<uint64_t>(cfg.max_steps) * global_batch, cfg.seed);
}

}  // namespace

TokenData open_token_data(const TrainConfig& cfg, const ModelConfig& model, int64_t global_batch, bool verify,
                          ProgressLine& progress) {
  // The model's vocabulary and EOS stand in for a tokenizer where the files carry no manifest.
  TokenSourceOptions options;
  options.vocab_size = model.vocab_size;
  options.eos_token_id = model.eos_token_id.value_or(-1);
  if (!cfg.token_dtype.empty()) options.dtype = parse_token_dtype(cfg.token_dtype);

  TokenData data;
  std::string sha;
  std::shared_ptr<const TokenShards> first;  // whose tokenizer the checkpoints carry
  if (cfg.sources.empty()) {
    auto shards = open_token_source(cfg.train_data, options);
    check_source(*shards, cfg.train_data, cfg, model, sha, verify, progress);
    check_document_eos(*shards, cfg.train_data, cfg, data.document_eos);
    data.train = train_instances(shards, cfg, global_batch);
    first = shards;
  } else {
    MixtureSpec spec;
    for (size_t i = 0; i < cfg.sources.size(); ++i) {
      const DataSourceConfig& s = cfg.sources[i];
      const std::string label =
          cfg.source + ": key 'data.sources[" + std::to_string(i) + "]' (source \"" + s.name + "\")";
      spec.sources.push_back({s.name, s.paths, s.ratio, s.max_repetition, label});
    }
    spec.requested_tokens = cfg.mix_tokens > 0
                                ? static_cast<uint64_t>(cfg.mix_tokens)
                                : static_cast<uint64_t>(cfg.max_steps) * global_batch * cfg.sequence_length;
    spec.sequence_length = cfg.sequence_length;
    spec.global_batch = static_cast<uint64_t>(global_batch);
    spec.seed = cfg.seed;
    spec.shuffle = cfg.shuffle;
    auto mixture = std::make_shared<SourceMixture>(spec, options);
    for (size_t s = 0; s < cfg.sources.size(); ++s)
      for (size_t p = 0; p < mixture->parts(s).size(); ++p) {
        check_source(*mixture->parts(s)[p], cfg.sources[s].paths[p], cfg, model, sha, verify, progress);
        check_document_eos(*mixture->parts(s)[p], cfg.sources[s].paths[p], cfg, data.document_eos);
      }
    data.mixture = mixture->describe();
    nlohmann::json sources = nlohmann::json::array();
    for (const auto& s : data.mixture["sources"]) sources.push_back({s["name"], s["paths"], s["instances"]});
    data.mixture_fingerprint = {{"instances_per_epoch", data.mixture["instances_per_epoch"]}, {"sources", sources}};
    data.train = mixture;
    first = mixture->parts(0)[0];
  }

  auto add_valid = [&](const std::string& path, const std::string& metric) {
    auto shards = open_token_source(path, options);
    check_source(*shards, path, cfg, model, sha, verify, progress);
    check_document_eos(*shards, path, cfg, data.document_eos);
    data.valid.push_back({metric, std::make_shared<InstanceLoader>(shards, cfg.sequence_length, 0, false)});
  };
  if (!cfg.valid_data.empty()) add_valid(cfg.valid_data, "valid_loss");
  for (const EvalSourceConfig& s : cfg.eval_sources) add_valid(s.path, "valid/" + s.name + "/loss");

  const RunTokenizer tokenizer = source_tokenizer(*first);
  data.tokenizer_file = tokenizer.file;
  data.tokenizer_note = tokenizer.note;
  return data;
}

}  // namespace archspace
