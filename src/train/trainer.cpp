#include "archspace/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "archspace/data/token_source.h"
#include "archspace/dist/test_fault.h"
#include "archspace/eval/tasks.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/train/autocast.h"
#include "archspace/train/checkpoint.h"
#include "archspace/train/run_tokenizer.h"
#include "archspace/train/step_profiler.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/malloc_policy.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The model of this stage: fresh, or the previous stage's weights with only RoPE/length changes allowed.
CausalLM build_stage_model(const TrainConfig& cfg, at::Device device) {
  if (cfg.init_from.empty()) return CausalLM::random_init(cfg.model(), cfg.seed, at::kFloat, device);
  const std::string model_dir = resolve_model_dir(cfg.init_from);
  if (const std::string checkpoint = checkpoint_of_model_dir(model_dir); !checkpoint.empty())
    verify_checkpoint(checkpoint);
  CausalLM prev = load_model(model_dir, {at::kFloat, device});
  ModelConfig next = prev.config();
  if (!cfg.preset.empty() || !cfg.model_config.empty()) {
    // The stage names its model too: it must be the same architecture as the weights it starts from.
    ModelConfig wanted = cfg.model();
    std::vector<std::string> diffs;
    auto same = [&](const char* field, auto a, auto b) {
      if (a != b) diffs.push_back(std::string(field) + " " + std::to_string(a) + " -> " + std::to_string(b));
    };
    if (wanted.variant != next.variant)
      diffs.push_back(std::string("variant ") + variant_name(next.variant) + " -> " + variant_name(wanted.variant));
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
      if (next.topology() != wanted.topology()) {
        diffs.push_back(std::string("norm_topology ") + norm_topology_name(next.topology()) + " -> " +
                        norm_topology_name(wanted.topology()));
      }
      same("siamese_depth_scaling", int(next.siamese_depth_scaling), int(wanted.siamese_depth_scaling));
      same("siamese_normalized_input", int(next.siamese_normalized_input), int(wanted.siamese_normalized_input));
    }
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw Error(
          cfg.source +
          ": a stage transition may change only the sequence length and RoPE, but this stage's model differs from " +
          model_dir + ":" + list);
    }
  }
  if (cfg.rope_scaling) next.rope_scaling = cfg.rope_scaling;
  if (cfg.max_position_embeddings) next.max_position_embeddings = *cfg.max_position_embeddings;
  return CausalLM(next, prev.parameters());
}

bool every(int64_t interval, int64_t step) { return interval > 0 && step % interval == 0; }

// SIGTERM/SIGINT (how clusters preempt jobs): the first asks the loop to save the step it is in and stop;
// a second one ends the process at once.
std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) ::_exit(128 + sig);
}

// Installs the handlers for the training loop and restores the previous ones after it.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, &previous_term_);
    sigaction(SIGINT, &action, &previous_int_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGINT, &previous_int_, nullptr);
  }

 private:
  struct sigaction previous_term_ {
  }, previous_int_{};
};

}  // namespace

// ---- setup ----------------------------------------------------------------------------------------

Trainer::Trainer(const TrainConfig& config, const TrainOptions& options)
    : cfg_(config), options_(options), progress_(std::make_unique<ProgressLine>("train", options.progress)) {
  // Before the model and the first step allocate: every step's large tensors then reuse mapped memory.
  if (const std::string note = keep_freed_memory_for_reuse(); !note.empty()) progress_->note(note);
  setup_device();
  setup_dist();
  setup_run_dir();
  model_ = std::make_unique<CausalLM>(build_stage_model(cfg_, device_));
  spikes_ = SpikeDetector(cfg_.spike_factor, cfg_.spike_window);
  if (cfg_.sequence_length > model_->config().max_position_embeddings) {
    throw Error(cfg_.source + ": key 'train.sequence_length' is " + std::to_string(cfg_.sequence_length) +
                ", more than the model's max_position_embeddings " +
                std::to_string(model_->config().max_position_embeddings) +
                " (a long-context stage sets model.max_position_embeddings)");
  }
  setup_data();
  setup_downstream();
  setup_optimizer();
}

Trainer::~Trainer() = default;

void Trainer::setup_device() {
  // A full disk or file-size limit must surface as a write error we can report, not a signal.
  std::signal(SIGXFSZ, SIG_IGN);
  dist_env_ = dist_env_from_environment();
  if (cfg_.threads > 0) {
    at::set_num_threads(cfg_.threads);
  } else if (dist_env_.local_world_size > 1) {
    // The default (the idle cores) is per machine: ranks sharing it share those cores.
    at::set_num_threads(std::max(1, at::get_num_threads() / dist_env_.local_world_size));
  }
  if (cfg_.device.kind == DeviceKind::kCuda && !at::hasCUDA()) {
    throw Error(cfg_.source + ": key 'train.device' is \"" + cfg_.device.name() + "\" but there is no CUDA device");
  }
  device_ = cfg_.device.device();
  // torchrun starts one rank per GPU: "cuda" without an index means this rank's own one.
  if (device_.is_cuda() && cfg_.device.index < 0 && dist_env_.world_size > 1)
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dist_env_.local_rank));
  // bf16 autocast on either device; on a CPU without AVX512-BF16 (or AMX) its matmuls are slower than
  // fp32, but the numbers are the same as on one that has it.
  autocast_ = cfg_.dtype == DType::kBf16;
}

void Trainer::setup_dist() {
  const int64_t cp = cfg_.context_parallel;
  if (dist_env_.world_size % cp != 0) {
    throw Error(cfg_.source + ": key 'train.context_parallel' is " + std::to_string(cp) +
                ", which does not divide the number of ranks " + std::to_string(dist_env_.world_size) +
                (dist_env_.world_size == 1 ? " (context parallelism runs under torchrun, one rank per slice)" : ""));
  }
  if (dist_env_.world_size == 1) return;
  rank_ = dist_env_.rank;
  world_ = dist_env_.world_size;
  progress_ = make_progress();
  // Before joining: the same error on every rank.
  std::optional<ShardLayout> layout;
  if (cfg_.sharding == Sharding::kFull)
    layout = ShardLayout::make(world_, static_cast<int>(cfg_.replicate_groups),
                               cfg_.source + ": key 'train.replicate_groups'");
  dist_ = std::make_unique<DistGroup>(dist_env_, device_, std::chrono::seconds(cfg_.dist_timeout_s));
  if (cp > 1) {
    cp_ = std::make_unique<ContextParallelism>(*dist_, cp, cfg_.sequence_length);
    progress_->note(std::to_string(world_) + " ranks: " + std::to_string(data_parallel_size()) + " data-parallel x " +
                    std::to_string(cp) + " context-parallel (slices of " + std::to_string(cfg_.sequence_length / cp) +
                    " tokens); global batch " + std::to_string(global_batch()) + " = micro_batch " +
                    std::to_string(cfg_.micro_batch) + " x grad_accum " + std::to_string(cfg_.grad_accum) + " x " +
                    std::to_string(data_parallel_size()) + " data-parallel ranks");
    return;
  }
  progress_->note(std::to_string(world_) + " data-parallel ranks: global batch " + std::to_string(global_batch()) +
                  " = micro_batch " + std::to_string(cfg_.micro_batch) + " x grad_accum " +
                  std::to_string(cfg_.grad_accum) + " x " + std::to_string(world_) + " ranks");
  if (test_fault().fault != TestFault::kNone)
    progress_->note("ARCHSPACE_TEST_FAULT is set: this run breaks itself on purpose (tests only)");
  // HSDP: shard within groups of consecutive ranks, replicate across them; FSDP: one group, the world.
  if (layout && layout->replicate_groups > 1) {
    const int group = rank_ / layout->shard_size(), place = rank_ % layout->shard_size();
    shard_group_ = dist_->subgroup(layout->shard_group_of(rank_), "HSDP shard group " + std::to_string(group));
    replicate_group_ =
        dist_->subgroup(layout->replicate_group_of(rank_), "HSDP replicate group " + std::to_string(place));
  }
}

void Trainer::setup_run_dir() {
  if (rank_ == 0) run_lock_ = std::make_unique<RunDirLock>(cfg_.run_dir);  // before anything reads or writes it
  if (!options_.resume_from.empty()) {
    resume_from_ = resolve_checkpoint(cfg_.run_dir, options_.resume_from);
  } else if (options_.resume) {
    resume_from_ = latest_checkpoint(cfg_.run_dir);
    if (resume_from_.empty())
      progress_->note("--resume: " + cfg_.run_dir + " has no checkpoint yet; starting from step 0");
  } else if (fs::exists(fs::path(cfg_.run_dir) / "checkpoints")) {
    throw Error(cfg_.run_dir +
                ": already holds a run (checkpoints/); use --resume to continue it or choose another train.run_dir");
  }
  fs::create_directories(cfg_.run_dir);
}

void Trainer::setup_data() {
  const ModelConfig& mc = model_->config();
  if (cfg_.format == DataFormat::kTokens) {
    TokenData data = open_token_data(cfg_, mc, global_batch(), rank_ == 0, *progress_);
    train_batches_ = std::make_unique<WindowBatches>(data.train);
    valid_ = std::move(data.valid);
    tokenizer_file_ = data.tokenizer_file;
    if (!data.tokenizer_note.empty()) progress_->note(data.tokenizer_note);
    mixture_fingerprint_ = data.mixture_fingerprint;
    mixture_record_ = data.mixture;
    document_eos_ = data.document_eos;
  } else {
    auto tokenizer = Tokenizer::load(cfg_.tokenizer);
    if (tokenizer->vocab_size() > mc.vocab_size) {
      throw Error(cfg_.source + ": tokenizer/model vocabulary mismatch: " + tokenizer->path() + " has " +
                  std::to_string(tokenizer->vocab_size()) + " ids but the model has vocab_size " +
                  std::to_string(mc.vocab_size));
    }
    const int64_t pad = mc.pad_token_id.value_or(tokenizer->token_to_id("<|pad|>").value_or(0));
    train_batches_ = std::make_unique<ChatBatches>(load_chat_jsonl(cfg_.train_data, *tokenizer), cfg_.sequence_length,
                                                   pad, cfg_.seed, cfg_.shuffle);
    tokenizer_file_ = tokenizer->path();
  }
}

// The downstream tasks are read and tokenized once, before the first step: a bad task name fails at once,
// and each evaluation only scores.
void Trainer::setup_downstream() {
  if (cfg_.downstream.empty()) return;
  const std::string key = cfg_.source + ": key 'eval.downstream'";
  if (tokenizer_file_.empty()) {
    throw Error(key + " needs the run's tokenizer, and " +
                (cfg_.sources.empty() ? cfg_.train_data : cfg_.sources[0].paths[0] + " (the mixture's first source)") +
                " carries none (tokenize the data with `archspace tokenize`, which stores it)");
  }
  const auto tokenizer = Tokenizer::load(tokenizer_file_);
  std::vector<TaskVariant> variants;
  try {
    variants =
        select_task_variants(default_task_dirs(), cfg_.downstream, cfg_.downstream_format, cfg_.downstream_shots);
  } catch (const Error& e) {
    throw Error(key + ": " + e.what());
  }
  for (const auto& v : variants) {
    downstream_.push_back(prepare_task(load_task(v.dir, v.task, v.format, v.shots, cfg_.downstream_limit), *tokenizer,
                                       model_->config(), cfg_.sequence_length));
  }
}

void Trainer::setup_optimizer() {
  if (dist_ && cfg_.sharding == Sharding::kFull) return setup_full_sharding();
  // Norms and SiameseNorm scales do not decay unless asked.
  const auto specs = parameter_specs(model_->config());
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor p = model_->parameters()[i].second;
    p.requires_grad_(true);
    const bool decay = specs[i].kind == ParamKind::kLinear ||
                       (specs[i].kind == ParamKind::kEmbedding && cfg_.decay_embeddings) ||
                       (specs[i].kind == ParamKind::kNorm && cfg_.decay_norms);
    params_.push_back({specs[i].name, p, decay});
  }
  optimizer_ = std::make_unique<AdamW>(
      params_, AdamWOptions{cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.fused && fused_adamw_available(device_)});
  if (dist_) {
    std::vector<at::Tensor> params;
    for (const auto& g : params_) params.push_back(g.param);
    reducer_ = std::make_unique<GradientReducer>(*dist_, params);
    if (cfg_.sharding == Sharding::kOptimizer) {
      // Balanced by size: the largest parameters first, each to the rank holding the fewest elements.
      std::vector<size_t> order(params.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
      std::vector<int64_t> load(world_, 0);
      owner_.assign(params.size(), 0);
      for (size_t i : order) {
        owner_[i] = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        load[owner_[i]] += params[i].numel();
      }
      std::vector<bool> owned(params.size());
      for (size_t i = 0; i < params.size(); ++i) owned[i] = owner_[i] == rank_;
      optimizer_->shard(owned);
      std::string shares;
      for (int r = 0; r < world_; ++r) shares += (r ? " / " : "") + std::to_string(load[r]);
      progress_->note("ZeRO-1: the ranks keep the AdamW moments of " + shares + " parameter elements");
    }
  }
  // One process on the CPU: the embedding's gradient stays allocated and only the rows a step touched are zeroed
  // (train/embedding_gradient.h). Data-parallel ranks keep the dense gradient the reducer's buckets expect.
  if (!dist_ && device_.is_cpu()) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kind != ParamKind::kEmbedding || params_[i].param.is_same(model_->head_weight())) continue;
      embedding_grad_ = std::make_unique<EmbeddingGradient>(params_[i].param);
      embedding_param_ = static_cast<int64_t>(i);
    }
  }
  // bf16: the matmul weights cast once, then rewritten by each optimizer step, not cast once per micro-batch and
  // recomputation. ZeRO-1: the owners' updates arrive by broadcast, which the copies would miss: cast every step.
  if (cfg_.dtype == DType::kBf16)
    weight_casts_ = std::make_unique<StepWeightCasts>(*model_, at::kBFloat16, /*kept_across_steps=*/owner_.empty());
}

// FSDP: the optimizer updates this rank's shards; the model's own tensors are released (the forward reads
// the weights through fsdp_). The ranks start from rank 0's weights, as sync_ranks() makes them otherwise.
void Trainer::setup_full_sharding() {
  {
    c10::NoGradGuard no_grad;
    for (const auto& [name, p] : model_->parameters()) {
      at::Tensor t = p;  // the same tensor
      dist_->broadcast(t, 0, "broadcasting parameter " + name + " from rank 0");
    }
  }
  DistGroup& shards = shard_group_ ? *shard_group_ : *dist_;
  fsdp_ = std::make_unique<FullyShardedModel>(*model_, shards, replicate_group_.get(), cfg_.decay_embeddings,
                                              cfg_.decay_norms);
  params_ = fsdp_->optimizer_groups();
  optimizer_ = std::make_unique<AdamW>(
      params_, AdamWOptions{cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.fused && fused_adamw_available(device_)});
  const int64_t total = parameter_count(model_->config());
  std::string layout = "FSDP: parameters, gradients and AdamW moments sharded over " +
                       std::to_string(shards.world_size()) + " ranks (" + std::to_string(fsdp_->shard_elements()) +
                       " of " + std::to_string(total) + " parameter elements per rank)";
  if (replicate_group_)
    layout += ", replicated over " + std::to_string(replicate_group_->world_size()) + " groups (HSDP)";
  progress_->note(layout);
}

void Trainer::zero_gradients() {
  if (fsdp_) return fsdp_->zero_gradients();
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].param.mutable_grad();
    if (static_cast<int64_t>(i) == embedding_param_)
      embedding_grad_->zero();  // the rows the step's lookups touched: the only nonzero ones
    else
      grad.reset();
  }
}

// ZeRO-1: each parameter's owner updated it; every rank takes the new values from there.
void Trainer::broadcast_updates() {
  if (owner_.empty()) return;
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    dist_->broadcast(params_[i].param, owner_[i], "broadcasting the update of " + params_[i].name);
}

// The whole optimizer state, whatever the sharding: checkpoints do not depend on the number of ranks.
// Sharded, each owner broadcasts its moments (every rank takes part; rank 0 keeps them).
NamedTensors Trainer::optimizer_state() {
  if (fsdp_) return fsdp_->full_optimizer_state(*optimizer_, at::kCPU);
  if (owner_.empty()) return optimizer_->state();
  NamedTensors full;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [m, v] = optimizer_->moments(i);
    for (auto [name, t] : {std::pair{"exp_avg.", m}, std::pair{"exp_avg_sq.", v}}) {
      if (!t.defined()) t = at::empty_like(params_[i].param, at::MemoryFormat::Contiguous);
      if (owner_[i] != 0) dist_->broadcast(t, owner_[i], std::string("gathering ") + name + params_[i].name);
      full.emplace_back(name + params_[i].name, t);
    }
  }
  return full;
}

// ---- resume ---------------------------------------------------------------------------------------

void Trainer::resume() {
  if (resume_from_.empty()) return;
  try {
    verify_checkpoint(resume_from_);
  } catch (const Error& e) {
    // Name the way out: the newest checkpoint that does verify, and the flag that resumes from it.
    const std::string intact = newest_intact_checkpoint(cfg_.run_dir, resume_from_);
    throw Error(std::string(e.what()) + "; " +
                (intact.empty() ? std::string("no other checkpoint of the run verifies (start again without --resume)")
                                : "the newest intact checkpoint is " + intact + ": resume from it with --resume-from " +
                                      fs::path(intact).filename().string()));
  }
  const json state = read_trainer_state(resume_from_);
  // Resuming under other batch geometry would silently read other instances: refuse.
  // The global batch counts every rank: another split of the same global batch (ranks x grad_accum) is fine.
  const std::string geometry = " (micro_batch " + std::to_string(cfg_.micro_batch) + " x grad_accum " +
                               std::to_string(cfg_.grad_accum) + " x " + std::to_string(data_parallel_size()) +
                               (cp_ ? " data-parallel ranks)" : " ranks)");
  for (const auto& [key, value] :
       {std::pair<const char*, int64_t>{"sequence_length", cfg_.sequence_length}, {"global_batch", global_batch()}}) {
    if (state.at(key).get<int64_t>() != value) {
      throw Error(cfg_.source + ": cannot resume " + resume_from_ + ": it was trained with " + key + " " +
                  state.at(key).dump() + ", this config says " + std::to_string(value) +
                  (std::string(key) == "global_batch" ? geometry : ""));
    }
  }
  // Another mixture (sources, their instances per epoch) would read other instances from here on: refuse.
  if (!mixture_fingerprint_.is_null() && state.contains("data_mixture") &&
      state["data_mixture"] != mixture_fingerprint_) {
    throw Error(cfg_.source + ": cannot resume " + resume_from_ + ": it was trained on the mixture " +
                state["data_mixture"].dump() + ", this config gives " + mixture_fingerprint_.dump() +
                " ([[data.sources]] or data.mix_tokens changed)");
  }
  CausalLM saved = load_model((fs::path(resume_from_) / "model").string(), {at::kFloat, device_});
  // The TOML may have been edited since (another preset, variant or switches): say so, not a shape error.
  const auto have = parameter_specs(model_->config()), had = parameter_specs(saved.config());
  for (size_t i = 0; i < std::max(have.size(), had.size()); ++i) {
    if (i >= have.size() || i >= had.size() || have[i].name != had[i].name || have[i].shape != had[i].shape) {
      const std::string was = i < had.size() ? had[i].name + " " + shape_string(had[i].shape) : std::string("(none)");
      const std::string is = i < have.size() ? have[i].name + " " + shape_string(have[i].shape) : std::string("(none)");
      throw Error(cfg_.source + ": cannot resume " + resume_from_ + ": its model is not this config's (parameter " +
                  std::to_string(i) + ": checkpoint " + was + ", config " + is + "); was the [model] section changed?");
    }
  }
  if (fsdp_) {
    fsdp_->load_full_parameters(saved.parameters());  // this rank's shards of them
  } else {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].param.copy_(saved.parameters()[i].second);
  }
  TensorStore store = TensorStore::open_file((fs::path(resume_from_) / "optimizer.safetensors").string());
  NamedTensors opt_state;
  for (const auto& n : store.names()) opt_state.emplace_back(n, store.tensor(n).to(device_));
  if (fsdp_) {
    fsdp_->load_full_optimizer_state(*optimizer_, opt_state, state.at("optimizer_steps").get<int64_t>(), resume_from_);
  } else {
    optimizer_->load_state(opt_state, state.at("optimizer_steps").get<int64_t>(), resume_from_);
  }
  start_step_ = state.at("step").get<int64_t>();
  tokens_seen_ = state.at("tokens").get<uint64_t>();
  if (state.contains("recent_losses")) spikes_.restore(state.at("recent_losses"));
  // CPU reductions depend on the thread count: a resume is bit-exact only with the run's own count, so
  // the default (the cores idle now) gives way to the one the run started with.
  if (cfg_.threads == 0 && state.contains("threads") && state.value("world_size", 1) == world_ &&
      state["threads"].get<int>() != at::get_num_threads()) {
    at::set_num_threads(state["threads"].get<int>());
    progress_->note("using the run's " + std::to_string(at::get_num_threads()) +
                    " CPU threads (train.threads sets others)");
  }
  progress_->note("resumed from " + resume_from_ + " at step " + std::to_string(start_step_));
}

// Every rank must start from the same step and weights: ranks that resumed different checkpoints (a run
// directory not shared by all machines) are refused, and rank 0's parameters are broadcast. Ranks built
// the same weights already (same seed or files); the broadcast makes that a guarantee, not an assumption.
void Trainer::sync_ranks() {
  if (!dist_) return;
  const at::Tensor steps = dist_->all_gather(at::tensor({start_step_}, at::kLong), "agreeing on the start step");
  if (!steps.eq(start_step_).all().item<bool>()) {
    throw Error(dist_->who() + ": the ranks start from different steps (this one from " + std::to_string(start_step_) +
                "): train.run_dir " + cfg_.run_dir + " must be one directory that all ranks share");
  }
  if (fsdp_) return;  // the shards were cut from rank 0's weights, or from the one checkpoint every rank read
  c10::NoGradGuard no_grad;
  for (auto& g : params_) dist_->broadcast(g.param, 0, "broadcasting parameter " + g.name + " from rank 0");
}

// ---- the loop -------------------------------------------------------------------------------------

TrainResult Trainer::run() {
  resume();
  // --stop-after stops at the one step it names: one the resumed run has already passed would never come,
  // and the run would go on to max_steps (a test that read `latest` while a newer checkpoint was published
  // but not yet named did exactly that).
  if (options_.stop_after_step > 0 && options_.stop_after_step <= start_step_) {
    throw Error("--stop-after " + std::to_string(options_.stop_after_step) + ": the run resumes at step " +
                std::to_string(start_step_) + " (" + resume_from_ + "), past it; nothing was trained");
  }
  sync_ranks();
  // The shares the mixture realised, beside the run (each start of the same run writes the same file).
  if (rank_ == 0 && !mixture_record_.is_null())
    write_text_file_atomically((fs::path(cfg_.run_dir) / "data_mixture.json").string(), mixture_record_.dump(2) + "\n");
  if (rank_ == 0) {
    const auto warn = [this](const std::string& m) {
      progress_->finish();
      std::fprintf(stderr, "warning: %s\n", m.c_str());
    };
    std::vector<std::unique_ptr<Tracker>> trackers;  // none for a run that is already finished
    if (start_step_ < cfg_.max_steps) trackers = make_trackers(cfg_.log, tracking_context(), warn);
    metrics_ = std::make_unique<MetricsLog>((fs::path(cfg_.run_dir) / "metrics.jsonl").string(), start_step_,
                                            std::move(trackers), warn);
  }
  progress_ = make_progress();  // elapsed and ETA from the first step
  started_ = std::chrono::steady_clock::now();
  TrainResult result;
  StopSignals stop_signals;
  StepProfiler profiler(cfg_.profile_steps, cfg_.run_dir, rank_);
  for (int64_t step = start_step_; step < cfg_.max_steps; ++step) {
    profiler.before_step(step);
    const auto step_start = std::chrono::steady_clock::now();
    const StepStats stats = train_step(step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (auto traced = profiler.after_step(step, seconds); traced && rank_ == 0)
      progress_->note("profile of steps " + std::to_string(cfg_.profile_steps[0]) + "-" +
                      std::to_string(cfg_.profile_steps[1]) + ": " + traced->trace_path + " (every rank beside it)\n" +
                      traced->table + profiler.comparison() + "\n");
    log_step(step, stats, seconds);
    show_progress(step, stats, seconds);
    result.losses.push_back(stats.loss);

    const bool last = step + 1 == cfg_.max_steps;
    const bool evaluation = every(cfg_.eval_interval, step + 1) || last;
    if (!downstream_.empty() && evaluation) evaluate_downstream(step);
    if (!valid_.empty() && evaluation) evaluate_validation(step);
    const bool saved = last || every(cfg_.checkpoint_interval, step + 1);
    if (saved) save(step + 1, last);
    if (const int sig = stop_signal_received(step)) {
      if (!saved) save(step + 1, false);
      progress_->note(std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + " after step " +
                      std::to_string(step + 1) + ": checkpoint " + last_checkpoint_ +
                      " written; --resume continues the run");
      result.stopped_by_signal = sig;
      break;
    }
    if (options_.stop_after_step > 0 && step + 1 == options_.stop_after_step) break;
  }
  if (start_step_ >= cfg_.max_steps) progress_->note("already finished (step " + std::to_string(start_step_) + ")");
  if (metrics_) metrics_->finish();  // the trackers' plots and closing (a failure there is a warning)
  progress_->finish();
  result.final_checkpoint = last_checkpoint_.empty() ? latest_checkpoint(cfg_.run_dir) : last_checkpoint_;
  return result;
}

// What the trackers show beside the config file: facts the engine derived from it.
TrackingContext Trainer::tracking_context() const {
  const int64_t parameters = parameter_count(model_->config());
  return {cfg_.run_dir,
          start_step_,
          cfg_.text,
          {{"world_size", world_},
           {"context_parallel", cfg_.context_parallel},
           {"global_batch", global_batch()},
           {"tokens_per_step", global_batch() * cfg_.sequence_length},
           {"parameters", parameters},
           {"variant", variant_name(model_->config().variant)},
           {"device", device_.str()}}};
}

// Rank 0 speaks for all; with train.log_all_ranks every rank reports, labelled (torchrun --log-dir with
// --redirects 3 puts each rank's lines in a file of its own).
std::unique_ptr<ProgressLine> Trainer::make_progress() const {
  const bool speaks = options_.progress && (rank_ == 0 || cfg_.log_all_ranks);
  return std::make_unique<ProgressLine>(
      world_ > 1 && cfg_.log_all_ranks ? "train rank " + std::to_string(rank_) : "train", speaks);
}

// The signal that asked the run to stop, or 0. Ranks agree (a signal may reach them at different steps).
int Trainer::stop_signal_received(int64_t step) {
  int sig = g_stop_signal.load();
  if (dist_) {
    at::Tensor any = at::tensor({sig}, at::kInt);
    dist_->all_reduce_sum(any, "agreeing whether to stop after step " + std::to_string(step + 1));
    if (any.item<int>() != 0 && sig == 0) sig = SIGTERM;
  }
  return sig;
}

StepStats Trainer::train_step(int64_t step) {
  RECORD_USER_SCOPE("archspace::train_step");  // one span per step in a profile (train.profile_steps)
  StepStats stats;
  stats.lr = scheduled_lr(step, cfg_.max_steps, cfg_.warmup_steps, cfg_.lr, cfg_.final_lr_factor);
  const int64_t G = global_batch();

  // The loss is normalised by the labelled token count of the whole global batch, so accumulating
  // micro-batches and summing over ranks (and over a sequence's context-parallel slices) gives the gradient
  // of the whole batch.
  std::vector<at::Tensor> ids;
  const std::vector<Batch> micro = assemble_micro_batches(step, ids);
  int64_t labelled = 0;
  for (const Batch& b : micro) labelled += labelled_tokens(b);
  if (dist_) {  // SFT slices differ in labelled tokens: normalise by the global count
    at::Tensor count = at::tensor({labelled}, at::kLong);
    dist_->all_reduce_sum(count, "summing the labelled tokens of step " + std::to_string(step + 1));
    labelled = count.item<int64_t>();
  }
  if (labelled == 0)
    throw Error("step " + std::to_string(step) +
                ": the batch has no labelled tokens (SFT examples without assistant tokens?)");

  if (embedding_grad_)  // the embedding's gradient rows this step's backward will write
    for (const Batch& b : micro) embedding_grad_->will_touch(b.input_ids);
  double ce = 0, z = 0;
  if (fsdp_) fsdp_->begin_step(step);
  // The step's bf16 weights go before the optimizer changes the fp32 ones, also when this step throws.
  struct EndOfCasts {
    StepWeightCasts* casts;
    ~EndOfCasts() {
      if (casts) casts->end_step();
    }
  } end_of_casts{weight_casts_.get()};
  for (size_t m = 0; m < micro.size(); ++m) {
    const Batch& b = micro[m];
    LossSums sums;
    {
      // The head runs in the loss (model/loss.h: chunk by chunk), under the forward's autocast.
      AutocastGuard autocast(autocast_, device_.type());
      const at::Tensor hidden = model_->forward(b.input_ids.to(device_), forward_options(true));
      sums = head_loss(hidden, fsdp_ ? fsdp_->head().lm_head : model_->head_weight(), b.labels.to(device_), cfg_.z_loss,
                       cfg_.loss_chunk_tokens, weight_casts_ ? weight_casts_->head_weight_cast() : at::Tensor());
    }
    at::Tensor loss = (sums.ce_sum + sums.z_sum) / static_cast<double>(labelled);
    if (fsdp_) {
      // Each unit's gradients are reduce-scattered (summed over the ranks) as its backward completes; the
      // micro-batches' sums accumulate in the shards' gradients. Or, with train.reduce_each_micro_batch =
      // false, in each rank's unsharded sums until the step's last micro-batch reduces them.
      fsdp_->set_gradient_sync(cfg_.reduce_each_micro_batch || m + 1 == micro.size());
      loss.backward();
      fsdp_->finish_backward();
    } else if (!reducer_) {
      loss.backward();
    } else {
      // The reducer averages over ranks; x world makes it the sum (exact for a power-of-two world).
      loss = loss * static_cast<double>(world_);
      if (m + 1 == micro.size()) {  // only the step's last backward all-reduces (the accumulated gradients)
        reducer_->arm();
        dist_->guard("the gradient all-reduce of step " + std::to_string(step + 1), [&] { loss.backward(); });
      } else {
        loss.backward();
      }
    }
    ce += sums.ce_sum.item<double>();
    z += sums.z_sum.item<double>();
  }
  if (weight_casts_) weight_casts_->end_step();  // the step's graph handles dropped before the optimizer's step
  std::string hash;
  if (dist_) {  // report the global batch's values, as one process would
    at::Tensor sums = at::tensor({ce, z}, at::kDouble);
    dist_->all_reduce_sum(sums, "summing the losses of step " + std::to_string(step + 1));
    ce = sums[0].item<double>();
    z = sums[1].item<double>();
    at::Tensor all = dist_->all_gather(at::cat(ids), "gathering the batch of step " + std::to_string(step + 1));
    // The ranks of a context-parallel group hold the same instances: one copy each, in data-parallel order.
    if (cp_)
      all = all.view({data_parallel_size(), cp_->degree(), -1, all.size(1)}).select(1, 0).reshape({-1, all.size(1)});
    hash = batch_hash(all);
  } else {
    hash = batch_hash(at::cat(ids));
  }
  if (step < cfg_.dump_gradients_steps && (rank_ == 0 || fsdp_)) dump_gradients(step);  // FSDP: every rank gathers

  std::vector<at::Tensor> params;
  for (const auto& g : params_) params.push_back(g.param);
  const int64_t L = model_->config().num_hidden_layers;
  if (cfg_.grad_norm_interval > 0 && every(cfg_.grad_norm_interval, step + 1) && (rank_ == 0 || fsdp_)) {
    // Before clipping: the gradients as backward made them (all-reduced already in data-parallel runs).
    std::vector<std::string> names;
    for (const auto& g : params_) names.push_back(g.name);
    stats.layer_grad_norms = fsdp_ ? fsdp_->layer_grad_norms(L) : layer_grad_norms(names, params, L);
  }
  // FSDP: the norm of the whole gradient from every rank's shards (collective).
  // One process: clipping reads and scales only the embedding rows the step looked up (the rest are zeros).
  std::vector<at::Tensor> nonzero_rows;
  if (embedding_grad_) {
    nonzero_rows.resize(params.size());
    nonzero_rows[static_cast<size_t>(embedding_param_)] = embedding_grad_->touched_rows();
  }
  // The optimizer's one-pass kernel applies the clip's coefficient as it reads each gradient (no pass of its own).
  float grad_scale = 1;
  if (fsdp_) {
    stats.grad_norm = fsdp_->clip_grad_norm(cfg_.clip_grad_norm);
  } else if (optimizer_->single_pass(device_)) {
    const GradientClip clip = clip_gradient_norm(params, cfg_.clip_grad_norm, nonzero_rows);
    stats.grad_norm = clip.norm;
    grad_scale = clip.coefficient;
  } else {
    stats.grad_norm = clip_grad_norm(params, cfg_.clip_grad_norm, nonzero_rows);
  }
  stats.loss = ce / labelled;
  stats.z_loss = z / labelled;
  stats.batch_hash = hash;
  stats.source_counts = train_batches_->source_counts(static_cast<uint64_t>(step) * G, G);  // the global batch's
  tokens_seen_ += G * cfg_.sequence_length;
  // Loss and gradient norm are global values here, so every rank takes the same decision.
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.z_loss) || !std::isfinite(stats.grad_norm)) {
    char what[160];
    std::snprintf(what, sizeof(what), "step %lld: the loss is %g (z-loss %g, gradient norm %g)",
                  static_cast<long long>(step + 1), stats.loss, stats.z_loss, stats.grad_norm);
    if (!cfg_.skip_nonfinite_steps) {
      if (metrics_) metrics_->write({{"step", step + 1}, {"diverged", true}});
      const std::string latest = latest_checkpoint(cfg_.run_dir);
      throw Error(std::string(what) + ": training diverged; nothing of this step was saved (the last checkpoint is " +
                  (latest.empty() ? std::string("none") : latest) +
                  "). Lower optim.lr, or set train.nonfinite = \"skip\"");
    }
    zero_gradients();  // no update from this batch
    stats.skipped = true;
    progress_->note(std::string(what) + ": skipped (train.nonfinite = \"skip\")");
    return stats;
  }
  // Loss spikes: every rank sees the same global loss, so every rank takes the same decision.
  stats.spike_baseline = spikes_.check(stats.loss);
  spikes_.accept(stats.loss);  // spikes too, as the sweep's rule does
  if (stats.spike_baseline) {
    char what[200];
    std::snprintf(what, sizeof(what), "step %lld: loss spike: %.4f > %g x %.4f (the median of the last %lld losses)",
                  static_cast<long long>(step + 1), stats.loss, cfg_.spike_factor, *stats.spike_baseline,
                  static_cast<long long>(cfg_.spike_window));
    if (cfg_.spike_policy == "stop") {
      if (metrics_) log_spike(step, stats);
      const std::string latest = latest_checkpoint(cfg_.run_dir);
      throw Error(std::string(what) + ": training stopped (train.spike = \"stop\"); nothing of this step was saved " +
                  "(the last checkpoint is " + (latest.empty() ? std::string("none") : latest) + ")");
    }
    if (cfg_.spike_policy == "skip") {
      zero_gradients();  // no update from this batch
      stats.skipped = true;
      progress_->note(std::string(what) + ": skipped (train.spike = \"skip\")");
      return stats;
    }
    progress_->note(what);
  }
  {
    RECORD_USER_SCOPE("archspace::optimizer_step");
    if (fsdp_) fsdp_->attach_gradients();  // each optimizer group's part of the (clipped) shard gradients
    // bf16: the optimizer also writes the next step's bf16 weights (StepWeightCasts' copies, kept across steps).
    const std::vector<at::Tensor> copies =
        weight_casts_ ? weight_casts_->copies_for(params) : std::vector<at::Tensor>{};
    optimizer_->step(stats.lr, cfg_.weight_decay, grad_scale, copies);
    if (weight_casts_) weight_casts_->copies_written(params);
  }
  broadcast_updates();
  zero_gradients();
  return stats;
}

std::vector<Batch> Trainer::assemble_micro_batches(int64_t step, std::vector<at::Tensor>& ids) const {
  // The global batch is instances [step * G, (step + 1) * G); data-parallel rank d computes the d-th of its
  // equal shares (the instances one process would see with grad_accum x ranks micro-batches), so the data
  // order does not depend on how the ranks split the work.
  const int64_t G = global_batch(), B = cfg_.micro_batch;
  const uint64_t first =
      static_cast<uint64_t>(step) * G + static_cast<uint64_t>(data_parallel_rank() * cfg_.grad_accum * B);
  std::vector<Batch> micro;
  for (int64_t m = 0; m < cfg_.grad_accum; ++m) {
    Batch b = train_batches_->batch(first + m * B, B);
    ids.push_back(b.input_ids);
    micro.push_back(cp_ ? cp_->slice(b) : b);
  }
  return micro;
}

SequenceOptions Trainer::forward_options(bool training) const {
  SequenceOptions forward;
  forward.activation_checkpointing = training && cfg_.activation_checkpointing;
  forward.final_hidden_only = true;  // the head runs in the loss (model/loss.h), chunk by chunk
  forward.context_parallel = cp_.get();
  forward.document_eos_id = document_eos_;  // validation sees the instances as training does
  // FSDP: each unit's weights gathered as it runs; bf16 training: the step's casts.
  forward.parameters = fsdp_ ? static_cast<ParameterSource*>(fsdp_.get()) : training ? weight_casts_.get() : nullptr;
  forward.sparse_embedding_gradient = training && embedding_grad_ != nullptr;
  return forward;
}

void Trainer::dump_gradients(int64_t step) const {
  NamedTensors grads;
  if (fsdp_) {
    grads = fsdp_->full_gradients(at::kCPU);  // every rank takes part; rank 0 writes
    if (rank_ != 0) return;
  } else {
    for (const auto& g : params_) grads.emplace_back(g.name, g.param.grad());
  }
  const fs::path dir = fs::path(cfg_.run_dir) / "debug";
  fs::create_directories(dir);
  char name[64];
  std::snprintf(name, sizeof(name), "grads-step-%06lld.safetensors", static_cast<long long>(step + 1));
  save_safetensors((dir / name).string(), grads);
}

// Mean validation loss per labelled token over the first eval.batches batches (no z-loss).
double Trainer::evaluate(const Instances& valid) {
  c10::NoGradGuard no_grad;
  const int64_t B = cfg_.micro_batch, instances = static_cast<int64_t>(valid.instances_per_epoch());
  const int64_t batches = std::max<int64_t>(std::min<int64_t>(cfg_.eval_batches, instances / B), 1);
  double loss = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    Batch batch = window_batch(valid, b * B, std::min<int64_t>(B, instances));
    if (cp_) batch = cp_->slice(batch);  // the group's ranks evaluate the same batch, a slice each
    const at::Tensor hidden = model_->forward(batch.input_ids.to(device_), forward_options(false));
    const LossSums s = head_loss(hidden, fsdp_ ? fsdp_->head().lm_head : model_->head_weight(),
                                 batch.labels.to(device_), 0, cfg_.loss_chunk_tokens);
    if (fsdp_) fsdp_->release();
    loss += s.ce_sum.item<double>();
    count += s.count;
  }
  if (cp_) {  // the slices' sums make the sequences'
    at::Tensor sums = at::tensor({loss, static_cast<double>(count)}, at::kDouble);
    cp_->group().all_reduce_sum(sums, "summing the validation loss over the context-parallel slices");
    loss = sums[0].item<double>();
    count = static_cast<int64_t>(sums[1].item<double>());
  }
  return loss / std::max<int64_t>(count, 1);
}

// One metrics.jsonl line with every validation set's loss: "valid_loss" (data.valid) and "valid/NAME/loss"
// ([[eval.sources]]). Every rank evaluates the same batches: no rank waits on another.
void Trainer::evaluate_validation(int64_t step) {
  json line = {{"step", step + 1}, {"tokens", tokens_seen_}};
  std::string text = "step " + std::to_string(step + 1) + " | validation loss";
  for (const ValidationSet& v : valid_) {
    const double loss = evaluate(*v.instances);
    line[v.metric] = loss;
    char value[128];
    if (v.metric == "valid_loss")
      std::snprintf(value, sizeof(value), " %.4f", loss);
    else  // valid/NAME/loss -> NAME
      std::snprintf(value, sizeof(value), " | %s %.4f", v.metric.substr(6, v.metric.size() - 11).c_str(), loss);
    text += value;
  }
  if (metrics_) metrics_->write(line);
  progress_->note(text);
}

// The downstream tasks' metrics, one metrics.jsonl line: {"step", "tokens", "downstream": {task: {"metric" (the
// task's primary), "value", "stderr", "n", "format", "shots"}}}. Every rank scores (no collective inside, so
// none waits on another); rank 0 logs. Scoring draws no random numbers, so a resumed run stays exact.
void Trainer::evaluate_downstream(int64_t step) {
  // FSDP: scoring runs the whole model through infer/, so every rank gathers a whole copy for it (the
  // memory of one unsharded model, for the evaluation only).
  std::unique_ptr<CausalLM> whole;
  if (fsdp_) whole = std::make_unique<CausalLM>(model_->config(), fsdp_->full_parameters(device_));
  const std::vector<TaskResult> results = evaluate_tasks(whole ? *whole : *model_, downstream_);
  nlohmann::json tasks = nlohmann::json::object();
  std::string line = "step " + std::to_string(step + 1) + " | downstream";
  for (const auto& r : results) {
    for (const auto& m : r.metrics) {
      if (!m.primary) continue;
      tasks[r.task] = {{"metric", m.name},
                       {"value", m.value},
                       {"stderr", std::isfinite(m.stderr_) ? nlohmann::json(m.stderr_) : nlohmann::json()},
                       {"n", r.documents},
                       {"format", r.format},
                       {"shots", r.shots}};
      char v[160];
      std::snprintf(v, sizeof(v), " %s %s %.4f", r.task.c_str(), m.name.c_str(), m.value);
      line += v;
    }
  }
  if (metrics_) metrics_->write({{"step", step + 1}, {"tokens", tokens_seen_}, {"downstream", tasks}});
  progress_->note(line);
}

// Rank 0 writes (all ranks hold the same weights and moments, so the checkpoint is the same whatever the
// number of ranks); the others wait for it at a barrier, so none runs ahead of the last saved step.
void Trainer::save(int64_t step, bool is_final) {
  NamedTensors opt_state = optimizer_state();
  // FSDP: the whole fp32 parameters, gathered unit by unit into host memory (every rank takes part).
  std::unique_ptr<CausalLM> whole;
  if (fsdp_) whole = std::make_unique<CausalLM>(model_->config(), fsdp_->full_parameters(at::kCPU));
  if (rank_ == 0) {
    json state = {{"step", step},
                  {"tokens", tokens_seen_},
                  {"optimizer_steps", optimizer_->steps_taken()},
                  {"next_instance", static_cast<uint64_t>(step) * global_batch()},
                  {"seed", cfg_.seed},
                  {"variant", variant_name(model_->config().variant)},
                  {"sequence_length", cfg_.sequence_length},
                  {"global_batch", global_batch()},
                  {"micro_batch", cfg_.micro_batch},
                  {"grad_accum", cfg_.grad_accum},
                  {"world_size", world_},
                  {"context_parallel", cfg_.context_parallel},
                  {"shard_optimizer", !owner_.empty()},
                  {"sharding", sharding_name(world_ > 1 ? cfg_.sharding : Sharding::kNone)},
                  {"replicate_groups", fsdp_ ? cfg_.replicate_groups : 1},
                  {"threads", at::get_num_threads()},
                  {"recent_losses", spikes_.state()}};
    if (!mixture_fingerprint_.is_null()) state["data_mixture"] = mixture_fingerprint_;
    std::string config_text = cfg_.text;
    if (world_ > 1 && !config_text.empty())
      config_text += "\n# trained on " + std::to_string(data_parallel_size()) + " data-parallel ranks (world_size " +
                     std::to_string(world_) + (cp_ ? ", context_parallel " + std::to_string(cp_->degree()) : "") +
                     ", global batch " + std::to_string(global_batch()) + ")\n";
    last_checkpoint_ = save_checkpoint(
        cfg_.run_dir, step, {whole ? whole.get() : model_.get(), opt_state, state, config_text, tokenizer_file_},
        cfg_.keep_last, is_final);
  }
  // train.dist_timeout_s bounds this wait too: a hung rank 0 must not hold the others forever.
  if (dist_) dist_->barrier("the barrier after the checkpoint of step " + std::to_string(step), dist_->timeout());
}

// ---- what a step reports --------------------------------------------------------------------------

void Trainer::log_step(int64_t step, const StepStats& s, double step_seconds) {
  if (!metrics_) return;  // rank 0 logs for all
  const double step_tokens = static_cast<double>(global_batch() * cfg_.sequence_length);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  json line = {{"step", step + 1},
               {"tokens", tokens_seen_},
               {"loss", s.loss},
               {"z_loss", s.z_loss},
               {"lr", s.lr},
               {"grad_norm", s.grad_norm},
               {"tokens_per_s", step_tokens / step_seconds},
               {"elapsed_s", elapsed},
               {"batch_hash", s.batch_hash}};
  if (!s.source_counts.empty()) {  // a mixture: the tokens of each source in this step's global batch
    json tokens = json::object();
    for (const auto& [name, instances] : s.source_counts) tokens[name] = instances * cfg_.sequence_length;
    line["source_tokens"] = tokens;
  }
  metrics_->write(line);
  if (s.spike_baseline) log_spike(step, s);
  if (s.skipped) metrics_->write({{"step", step + 1}, {"skipped", true}});
  // No "loss" key in these lines: readers take the lines with "loss" as the step lines.
  if (!s.layer_grad_norms.is_null()) metrics_->write({{"step", step + 1}, {"grad_norms", s.layer_grad_norms}});
}

void Trainer::log_spike(int64_t step, const StepStats& s) {
  metrics_->write({{"step", step + 1},
                   {"spike", true},
                   {"spike_loss", s.loss},
                   {"spike_baseline", *s.spike_baseline},
                   {"spike_policy", cfg_.spike_policy}});
}

void Trainer::show_progress(int64_t step, const StepStats& s, double step_seconds) {
  const int64_t done = step + 1 - start_step_, total = cfg_.max_steps - start_step_;
  char what[192];
  std::snprintf(what, sizeof(what), "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s",
                static_cast<long long>(step + 1), static_cast<long long>(cfg_.max_steps), s.loss, s.lr, s.grad_norm,
                static_cast<double>(global_batch() * cfg_.sequence_length) / step_seconds);
  progress_->update(what, static_cast<double>(done) / static_cast<double>(total), done == 1 || done == total);
}

TrainResult run_training(const TrainConfig& config, const TrainOptions& options) {
  return Trainer(config, options).run();
}

}  // namespace archspace
