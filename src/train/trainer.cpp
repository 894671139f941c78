#include "archspace/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "archspace/data/instance_loader.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/chat/chat.h"
#include "archspace/train/checkpoint.h"
#include "archspace/train/optimizer.h"
#include "archspace/util/error.h"
#include "archspace/util/progress.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kIgnore = -100;

// ---- loss -----------------------------------------------------------------------------------------

LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff) {
  const int64_t V = logits.size(-1);
  at::Tensor flat = logits.reshape({-1, V}).to(at::kFloat);
  at::Tensor target = labels.reshape({-1});
  at::Tensor valid = target != kIgnore;
  at::Tensor lse = at::logsumexp(flat, -1);
  at::Tensor picked = flat.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
  at::Tensor mask = valid.to(at::kFloat);
  return {((lse - picked) * mask).sum(), (lse.pow(2) * mask).sum() * z_loss_coeff, valid.sum().item<int64_t>()};
}

// ---- data -----------------------------------------------------------------------------------------

namespace {

struct Batch {
  at::Tensor input_ids;  // [B, T]
  at::Tensor labels;     // [B, T], kIgnore where no loss
};

// Pretraining windows: inputs are the window, labels the window shifted left (last position unlabelled).
Batch window_batch(const InstanceLoader& loader, uint64_t first, int64_t count) {
  at::Tensor ids = loader.batch(first, count);
  at::Tensor labels = at::full_like(ids, kIgnore);
  labels.narrow(1, 0, ids.size(1) - 1).copy_(ids.narrow(1, 1, ids.size(1) - 1));
  return {ids, labels};
}

// SFT examples, padded or cut to the sequence length; loss only on assistant tokens.
class ChatBatches {
 public:
  ChatBatches(std::vector<ChatExample> examples, int64_t seq_len, int64_t pad_id, uint64_t seed, bool shuffle)
      : examples_(std::move(examples)), seq_len_(seq_len), pad_id_(pad_id), seed_(seed), shuffle_(shuffle) {}
  Batch batch(uint64_t first, int64_t count) const {
    at::Tensor ids = at::full({count, seq_len_}, pad_id_, at::kLong), labels = at::full({count, seq_len_}, kIgnore, at::kLong);
    const uint64_t n = examples_.size();
    for (int64_t b = 0; b < count; ++b) {
      const uint64_t index = first + b, epoch = index / n, pos = index % n;
      const ChatExample& ex = examples_[shuffle_ ? IndexPermutation(n, seed_ * 1000003 + epoch)(pos) : pos];
      const int64_t len = std::min<int64_t>(ex.ids.size(), seq_len_);
      auto id_a = ids.accessor<int64_t, 2>(), lab_a = labels.accessor<int64_t, 2>();
      for (int64_t t = 0; t < len; ++t) {
        id_a[b][t] = ex.ids[t];
        if (t + 1 < len && ex.trained[t + 1]) lab_a[b][t] = ex.ids[t + 1];
      }
    }
    return {ids, labels};
  }
  size_t size() const { return examples_.size(); }

 private:
  std::vector<ChatExample> examples_;
  int64_t seq_len_, pad_id_;
  uint64_t seed_;
  bool shuffle_;
};

std::string batch_hash(const at::Tensor& ids) {
  // FNV-1a over the token ids: lets two runs show they saw the very same batches.
  uint64_t h = 1469598103934665603ull;
  const at::Tensor c = ids.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}


// The model of this stage: fresh, or the previous stage's weights with only RoPE/length changes allowed.
CausalLM build_model(const TrainConfig& cfg, at::Device device) {
  if (cfg.init_from.empty()) return CausalLM::random_init(cfg.model(), cfg.seed, at::kFloat, device);
  const std::string model_dir = resolve_model_dir(cfg.init_from);
  const fs::path checkpoint = fs::path(model_dir).parent_path();
  if (fs::exists(checkpoint / "checksums.json")) verify_checkpoint(checkpoint.string());
  CausalLM prev = load_model(model_dir, {at::kFloat, device});
  ModelConfig next = prev.config();
  if (!cfg.preset.empty() || !cfg.model_config.empty()) {
    // The stage names its model too: it must be the same architecture as the weights it starts from.
    ModelConfig wanted = cfg.model();
    std::vector<std::string> diffs;
    auto same = [&](const char* field, auto a, auto b) {
      if (a != b) diffs.push_back(std::string(field) + " " + std::to_string(a) + " -> " + std::to_string(b));
    };
    if (wanted.variant != next.variant) diffs.push_back(std::string("variant ") + variant_name(next.variant) + " -> " + variant_name(wanted.variant));
    same("hidden_size", next.hidden_size, wanted.hidden_size);
    same("num_hidden_layers", next.num_hidden_layers, wanted.num_hidden_layers);
    same("num_attention_heads", next.num_attention_heads, wanted.num_attention_heads);
    same("num_key_value_heads", next.num_key_value_heads, wanted.num_key_value_heads);
    same("head_dim", next.head_dim, wanted.head_dim);
    same("intermediate_size", next.intermediate_size, wanted.intermediate_size);
    same("vocab_size", next.vocab_size, wanted.vocab_size);
    if (next.variant == Variant::kSiameseDepth && wanted.variant == next.variant) {
      same("use_siamese_norm", int(next.use_siamese_norm), int(wanted.use_siamese_norm));
      same("use_depth_attention", int(next.use_depth_attention), int(wanted.use_depth_attention));
      same("depth_attention_stride", next.depth_attention_stride, wanted.depth_attention_stride);
      same("depth_attention_recent_window", next.depth_attention_recent_window, wanted.depth_attention_recent_window);
    }
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw Error(cfg.source + ": a stage transition may change only the sequence length and RoPE, but this stage's model differs from " +
                  model_dir + ":" + list);
    }
  }
  if (cfg.rope_scaling) next.rope_scaling = cfg.rope_scaling;
  if (cfg.max_position_embeddings) next.max_position_embeddings = *cfg.max_position_embeddings;
  return CausalLM(next, prev.parameters());
}

}  // namespace

// ---- the loop ---------------------------------------------------------------------------------------

TrainResult run_training(const TrainConfig& cfg, const TrainOptions& options) {
  // A full disk or file-size limit must surface as a write error we can report, not a signal.
  std::signal(SIGXFSZ, SIG_IGN);
  if (cfg.threads > 0) at::set_num_threads(cfg.threads);
  const at::Device device = cfg.device == "cpu" ? at::Device(at::kCPU) : at::Device(cfg.device);
  if (device.is_cuda() && !at::hasCUDA()) throw Error(cfg.source + ": key 'train.device' is \"" + cfg.device + "\" but there is no CUDA device");
  const bool autocast = cfg.dtype == "bf16";
  if (autocast && !device.is_cuda()) throw Error(cfg.source + ": key 'train.dtype' = \"bf16\" (autocast) needs a CUDA device; use fp32 on CPU");

  const fs::path run_dir(cfg.run_dir);
  std::string resume_from;
  if (options.resume) {
    resume_from = latest_checkpoint(cfg.run_dir);
    if (resume_from.empty()) std::fprintf(stderr, "[train] --resume: %s has no checkpoint yet; starting from step 0\n", cfg.run_dir.c_str());
  } else if (fs::exists(run_dir / "checkpoints")) {
    throw Error(cfg.run_dir + ": already holds a run (checkpoints/); use --resume to continue it or choose another train.run_dir");
  }
  fs::create_directories(run_dir);

  CausalLM model = build_model(cfg, device);
  const ModelConfig& mc = model.config();

  // Data.
  std::unique_ptr<InstanceLoader> train_loader, valid_loader;
  std::unique_ptr<ChatBatches> chat;
  if (cfg.format == "tokens") {
    auto shards = TokenShards::open(cfg.train_data);
    if (shards->manifest().vocab_size > mc.vocab_size) {
      throw Error(cfg.source + ": tokenizer/model vocabulary mismatch: " + cfg.train_data + " was tokenized with " + shards->manifest().tokenizer_name +
                  " (" + std::to_string(shards->manifest().vocab_size) + " ids) but the model has vocab_size " + std::to_string(mc.vocab_size));
    }
    train_loader = std::make_unique<InstanceLoader>(shards, cfg.sequence_length, cfg.seed, cfg.shuffle);
    if (!cfg.valid_data.empty()) {
      auto vshards = TokenShards::open(cfg.valid_data);
      if (vshards->manifest().tokenizer_sha256 != shards->manifest().tokenizer_sha256) {
        throw Error(cfg.source + ": data.valid and data.train were tokenized with different tokenizers");
      }
      valid_loader = std::make_unique<InstanceLoader>(vshards, cfg.sequence_length, 0, false);
    }
  } else {
    auto tokenizer = Tokenizer::load(cfg.tokenizer);
    if (tokenizer->vocab_size() > mc.vocab_size) {
      throw Error(cfg.source + ": tokenizer/model vocabulary mismatch: " + tokenizer->path() + " has " + std::to_string(tokenizer->vocab_size()) +
                  " ids but the model has vocab_size " + std::to_string(mc.vocab_size));
    }
    const int64_t pad = mc.pad_token_id.value_or(tokenizer->token_to_id("<|pad|>").value_or(0));
    chat = std::make_unique<ChatBatches>(load_chat_jsonl(cfg.train_data, *tokenizer), cfg.sequence_length, pad, cfg.seed, cfg.shuffle);
  }
  auto get_batch = [&](uint64_t first, int64_t count) { return chat ? chat->batch(first, count) : window_batch(*train_loader, first, count); };

  // Parameters and optimizer groups: norms and SiameseNorm scales do not decay unless asked.
  std::vector<AdamW::Group> groups;
  {
    const auto specs = parameter_specs(mc);
    for (size_t i = 0; i < specs.size(); ++i) {
      at::Tensor p = model.parameters()[i].second;
      p.requires_grad_(true);
      bool decay = specs[i].kind == ParamKind::kLinear || (specs[i].kind == ParamKind::kEmbedding && cfg.decay_embeddings) ||
                   (specs[i].kind == ParamKind::kNorm && cfg.decay_norms);
      groups.push_back({specs[i].name, p, decay});
    }
  }
  AdamW optimizer(groups, {cfg.beta1, cfg.beta2, cfg.eps});

  int64_t start_step = 0;
  uint64_t tokens_seen = 0;
  if (!resume_from.empty()) {
    verify_checkpoint(resume_from);
    const json state = read_trainer_state(resume_from);
    CausalLM saved = load_model((fs::path(resume_from) / "model").string(), {at::kFloat, device});
    {
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < groups.size(); ++i) groups[i].param.copy_(saved.parameters()[i].second);
    }
    TensorStore opt_store = TensorStore::open_file((fs::path(resume_from) / "optimizer.safetensors").string());
    NamedTensors opt_state;
    for (const auto& n : opt_store.names()) opt_state.emplace_back(n, opt_store.tensor(n).to(device));
    // Resuming under other batch geometry would silently read other instances: refuse.
    for (const auto& [key, value] : {std::pair<const char*, int64_t>{"sequence_length", cfg.sequence_length}, {"global_batch", cfg.global_batch()}}) {
      if (state.at(key).get<int64_t>() != value) {
        throw Error(cfg.source + ": cannot resume " + resume_from + ": it was trained with " + key + " " + state.at(key).dump() +
                    ", this config says " + std::to_string(value));
      }
    }
    start_step = state.at("step").get<int64_t>();
    tokens_seen = state.at("tokens").get<uint64_t>();
    optimizer.load_state(opt_state, state.at("optimizer_steps").get<int64_t>(), resume_from);
    std::fprintf(stderr, "[train] resumed from %s at step %lld\n", resume_from.c_str(), (long long)start_step);
  }

  // Metrics: drop lines beyond the resumed step, so that the curve has each step once.
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  {
    std::vector<std::string> keep;
    std::ifstream in(metrics_path);
    for (std::string line; std::getline(in, line);) {
      try {
        if (json::parse(line).at("step").get<int64_t>() <= start_step) keep.push_back(line);
      } catch (const std::exception&) {
      }
    }
    std::ofstream out(metrics_path, std::ios::trunc);
    for (const auto& l : keep) out << l << "\n";
  }
  std::ofstream metrics(metrics_path, std::ios::app);

  const int64_t G = cfg.global_batch(), B = cfg.micro_batch;
  const bool tty = ::isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  auto last_print = t0;
  TrainResult result;
  std::string last_checkpoint;

  auto evaluate = [&]() {
    c10::NoGradGuard no_grad;
    double loss = 0;
    int64_t count = 0;
    const int64_t batches = std::min<int64_t>(cfg.eval_batches, valid_loader->instances_per_epoch() / B);
    for (int64_t b = 0; b < std::max<int64_t>(batches, 1); ++b) {
      Batch batch = window_batch(*valid_loader, b * B, std::min<int64_t>(B, valid_loader->instances_per_epoch()));
      LossSums s = next_token_loss(model.forward(batch.input_ids.to(device)), batch.labels.to(device), 0);
      loss += s.ce_sum.item<double>();
      count += s.count;
    }
    return loss / std::max<int64_t>(count, 1);
  };

  auto checkpoint = [&](int64_t step, bool is_final) {
    json state = {{"step", step},
                  {"tokens", tokens_seen},
                  {"optimizer_steps", optimizer.steps_taken()},
                  {"next_instance", static_cast<uint64_t>(step) * G},
                  {"seed", cfg.seed},
                  {"variant", variant_name(mc.variant)},
                  {"sequence_length", cfg.sequence_length},
                  {"global_batch", G}};
    last_checkpoint = save_checkpoint(cfg.run_dir, step, {&model, optimizer.state(), state, cfg.source}, cfg.keep_last, is_final);
  };

  for (int64_t step = start_step; step < cfg.max_steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    const double lr = scheduled_lr(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.final_lr_factor);

    // The global batch is instances [step * G, (step + 1) * G); normalise by its labelled token count.
    std::vector<Batch> micro;
    int64_t labelled = 0;
    std::vector<at::Tensor> all_ids;
    for (int64_t m = 0; m < cfg.grad_accum; ++m) {
      micro.push_back(get_batch(static_cast<uint64_t>(step) * G + m * B, B));
      labelled += (micro.back().labels != kIgnore).sum().item<int64_t>();
      all_ids.push_back(micro.back().input_ids);
    }
    if (labelled == 0) throw Error("step " + std::to_string(step) + ": the batch has no labelled tokens (SFT examples without assistant tokens?)");
    double ce = 0, z = 0;
    for (const Batch& b : micro) {
      if (autocast) {
        at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
        at::autocast::set_autocast_enabled(at::kCUDA, true);
      }
      at::Tensor logits = model.forward(b.input_ids.to(device));
      if (autocast) {
        at::autocast::set_autocast_enabled(at::kCUDA, false);
        at::autocast::clear_cache();  // drop the bf16 copies of the weights made for this forward
      }
      LossSums s = next_token_loss(logits, b.labels.to(device), cfg.z_loss);
      ((s.ce_sum + s.z_sum) / static_cast<double>(labelled)).backward();
      ce += s.ce_sum.item<double>();
      z += s.z_sum.item<double>();
    }
    if (step < cfg.dump_gradients_steps) {
      NamedTensors grads;
      for (const auto& g : groups) grads.emplace_back(g.name, g.param.grad());
      fs::create_directories(run_dir / "debug");
      char name[64];
      std::snprintf(name, sizeof(name), "grads-step-%06lld.safetensors", (long long)step + 1);
      save_safetensors((run_dir / "debug" / name).string(), grads);
    }

    // Gradient norm and clipping, as torch.nn.utils.clip_grad_norm_ computes them.
    double grad_norm;
    {
      c10::NoGradGuard no_grad;
      std::vector<at::Tensor> norms;
      for (const auto& g : groups) norms.push_back(at::linalg_vector_norm(g.param.grad(), 2));
      at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
      grad_norm = total.item<double>();
      if (cfg.clip_grad_norm > 0) {
        at::Tensor coef = at::clamp_max(cfg.clip_grad_norm / (total + 1e-6), 1.0);
        for (const auto& g : groups) g.param.mutable_grad().mul_(coef);
      }
    }
    optimizer.step(lr, cfg.weight_decay);
    for (const auto& g : groups) g.param.mutable_grad().reset();

    const int64_t step_tokens = G * cfg.sequence_length;
    tokens_seen += step_tokens;
    const auto now = std::chrono::steady_clock::now();
    const double step_s = std::chrono::duration<double>(now - step_start).count();
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    const double loss = ce / labelled, zl = z / labelled;
    json line = {{"step", step + 1}, {"tokens", tokens_seen}, {"loss", loss}, {"z_loss", zl}, {"lr", lr}, {"grad_norm", grad_norm},
                 {"tokens_per_s", step_tokens / step_s}, {"elapsed_s", elapsed}, {"batch_hash", batch_hash(at::cat(all_ids))}};
    metrics << line.dump() << "\n" << std::flush;
    result.losses.push_back(loss);

    const int64_t done = step + 1 - start_step, left = cfg.max_steps - step - 1;
    if (options.progress && (std::chrono::duration<double>(now - last_print).count() > (tty ? 0.3 : 5.0) || left == 0 || done == 1)) {
      std::fprintf(stderr, "%s[train] step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | elapsed %s | ETA %s%s", tty ? "\r" : "",
                   (long long)step + 1, (long long)cfg.max_steps, loss, lr, grad_norm, step_tokens / step_s, format_duration(elapsed).c_str(),
                   format_duration(elapsed / done * left).c_str(), tty && left ? "" : "\n");
      std::fflush(stderr);
      last_print = now;
    }
    if (valid_loader && ((cfg.eval_interval > 0 && (step + 1) % cfg.eval_interval == 0) || left == 0)) {
      const double vl = evaluate();
      metrics << json{{"step", step + 1}, {"tokens", tokens_seen}, {"valid_loss", vl}}.dump() << "\n" << std::flush;
      if (options.progress) std::fprintf(stderr, "%s[eval] step %lld | validation loss %.4f\n", tty ? "\n" : "", (long long)step + 1, vl);
    }
    if (left == 0) {
      checkpoint(step + 1, true);
    } else if (cfg.checkpoint_interval > 0 && (step + 1) % cfg.checkpoint_interval == 0) {
      checkpoint(step + 1, false);
    }
    if (options.stop_after_step > 0 && step + 1 == options.stop_after_step) break;
  }
  if (start_step >= cfg.max_steps && options.progress) std::fprintf(stderr, "[train] already finished (step %lld)\n", (long long)start_step);
  result.final_checkpoint = last_checkpoint.empty() ? latest_checkpoint(cfg.run_dir) : last_checkpoint;
  return result;
}

}  // namespace archspace
