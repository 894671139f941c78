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
#include <utility>

#include "archspace/data/token_source.h"
#include "archspace/dist/test_fault.h"
#include "archspace/io/run_dir.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/model/init.h"
#include "archspace/model/model_io.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/train/autocast.h"
#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/checkpoint.h"
#include "archspace/train/lr_schedule.h"
#include "archspace/train/run_tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/malloc_policy.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The model of this stage: fresh, or the previous stage's weights with only RoPE/length changes allowed.
CausalLM build_stage_model(const TrainConfig& cfg, at::Device device) {
  if (cfg.init_from.empty()) return initialised_model(cfg.model(), cfg.seed, cfg.init, at::kFloat, device);
  std::string model_dir;
  try {
    model_dir = model_dir_for_use(cfg.init_from);  // a checkpoint's checksums verified first
  } catch (const Error& e) {
    throw Error(cfg.source + ": model.init_from: " + e.what());
  }
  CausalLM prev = load_model(model_dir, {at::kFloat, device});
  ModelConfig next = prev.config();
  if (!cfg.preset.empty() || !cfg.model_config.empty()) {
    // The stage names its model too: it must be the same architecture as the weights it starts from.
    ModelConfig wanted = cfg.model();
    const std::vector<std::string> diffs = next.architecture_differences(wanted);
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
  if (cfg_.sequence_length > model_->config().max_position_embeddings) {
    throw Error(cfg_.source + ": key 'train.sequence_length' is " + std::to_string(cfg_.sequence_length) +
                ", more than the model's max_position_embeddings " +
                std::to_string(model_->config().max_position_embeddings) +
                " (a long-context stage sets model.max_position_embeddings)");
  }
  setup_data();
  register_callbacks(callbacks_, *this);  // the downstream tasks are read here: a bad task name fails at once
  setup_strategy();
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
  if (cfg_.fused_kernels && device_.is_cuda() && !fused_training_cuda_built()) {
    throw Error(cfg_.source + ": key 'train.fused_kernels' is true but this build has no CUDA launch of the fused " +
                "kernels (configured without nvcc); rebuild where the CUDA toolkit is, or set it false");
  }
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
  if (cfg_.sharding == Sharding::kFull)
    shard_layout_ = ShardLayout::make(world_, static_cast<int>(cfg_.replicate_groups),
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

// The parallel mode, chosen once: the step reads the same in every mode (train/gradient_strategy.h).
void Trainer::setup_strategy() {
  strategy_ = make_gradient_strategy(parallel_mode(cfg_, world_),
                                     {cfg_, *model_, device_, dist_.get(), cp_.get(), shard_layout_, *progress_});
}

// ---- resume ---------------------------------------------------------------------------------------

namespace {

// What a run's recipe decides (config/recipe.h), as checkpoints record it.
json recipe_fingerprint(const TrainConfig& c) {
  return {{"recipe", recipe_name(c.recipe)},
          {"schedule", schedule_shape_name(c.schedule)},
          {"schedule_convention", convention_name(c.schedule_convention)},
          {"decay_norms", c.decay_norms},
          {"decay_embeddings", c.decay_embeddings},
          {"skip_steps", c.skip_steps},
          {"data_order", data_order_name(c.data_order)}};
}

}  // namespace

// A resumed run keeps the recipe it began with: another schedule convention, other decay groups, step skipping or
// data order from here on would make it a run of no recipe. Checkpoints written before optim.recipe existed followed
// the archspace rule.
void Trainer::check_recipe(const json& state) const {
  json had = state.value("optim_recipe", json());
  const bool before_recipes = had.is_null();
  if (before_recipes) {
    const RecipeDefaults old = recipe_defaults(Recipe::kArchspace);
    had = {{"schedule_convention", convention_name(old.convention)},
           {"decay_norms", old.decay_norms},
           {"decay_embeddings", old.decay_embeddings},
           {"skip_steps", old.skip_steps},
           {"data_order", data_order_name(DataOrder::kArchspace)}};
  }
  const json now = recipe_fingerprint(cfg_);
  std::string differs;
  for (const auto& [key, value] : had.items()) {
    if (key == "recipe" || (now.contains(key) && now[key] == value)) continue;
    const std::string section = key == "data_order" ? "train." : "optim.";
    differs +=
        (differs.empty() ? "" : ", ") + section + key + " " + value.dump() + " -> " + now.value(key, json()).dump();
  }
  if (differs.empty()) return;
  throw Error(cfg_.source + ": cannot resume " + resume_from_ + ": it was trained " +
              (before_recipes ? std::string("before optim.recipe existed, under the archspace rule")
                              : "under optim.recipe = " + had.value("recipe", json()).dump()) +
              ", and this config changes " + differs + "; set " +
              (before_recipes ? std::string("optim.recipe = \"archspace\"")
                              : "optim.recipe = " + had.value("recipe", json()).dump() + " (and the keys above)") +
              " to continue it as it began");
}

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
  check_recipe(state);
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
  TensorStore store = TensorStore::open_file((fs::path(resume_from_) / "optimizer.safetensors").string());
  NamedTensors opt_state;
  for (const auto& n : store.names()) opt_state.emplace_back(n, store.tensor(n).to(device_));
  strategy_->load(saved.parameters(), opt_state, state.at("optimizer_steps").get<int64_t>(), resume_from_);
  start_step_ = state.at("step").get<int64_t>();
  tokens_seen_ = state.at("tokens").get<uint64_t>();
  callbacks_.load_state(state);  // e.g. the spike policy's recent losses
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
  strategy_->broadcast_parameters();
}

// A run resumed at its last step has its final checkpoint written, but a kill or a full disk may have come before
// `latest`, `final` or the pruning of older checkpoints named it final: publishing it again completes the save as an
// uninterrupted run ends it, and changes nothing where the run had finished.
void Trainer::complete_final_save() {
  const std::string step = std::to_string(start_step_);
  const fs::path own = fs::path(cfg_.run_dir) / "checkpoints" / fs::path(resume_from_).filename();
  const bool of_this_run = !resume_from_.empty() && fs::exists(own) && fs::equivalent(own, resume_from_);
  if (start_step_ != cfg_.max_steps || !of_this_run) {  // past max_steps, or resumed from another run's checkpoint
    progress_->note("already at step " + step + " of train.max_steps " + std::to_string(cfg_.max_steps) +
                    ": nothing to train");
    return;
  }
  if (rank_ == 0) {
    const std::vector<std::string> changed =
        publish_checkpoint(cfg_.run_dir, fs::path(resume_from_).filename().string(), cfg_.keep_last, true);
    std::string what;
    for (const auto& c : changed) what += (what.empty() ? "" : ", ") + c;
    progress_->note(changed.empty() ? "already finished (step " + step + ")"
                                    : "completed the interrupted final save of step " + step + " (" + what + ")");
  }
  if (dist_) dist_->barrier("the barrier after completing the final save", dist_->timeout());
  last_checkpoint_ = resume_from_;
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
  TrainResult result;
  try {
    callbacks_.on_start(*this);
    progress_ = make_progress();  // elapsed and ETA from the first step
    StopSignals stop_signals;
    for (int64_t step = start_step_; step < cfg_.max_steps; ++step) {
      callbacks_.pre_step(*this, step);
      const auto step_start = std::chrono::steady_clock::now();
      const StepStats stats = train_step(step);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      result.losses.push_back(stats.loss);
      callbacks_.post_step(*this, step, stats, seconds);  // metrics, progress, evaluations, checkpoints
      if (const int sig = stop_signal_received(step)) {
        callbacks_.on_stop_signal(*this, step, sig);  // the checkpointing callback saves the step
        progress_->note(std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + " after step " +
                        std::to_string(step + 1) + ": checkpoint " + last_checkpoint_ +
                        " written; --resume continues the run");
        result.stopped_by_signal = sig;
        break;
      }
      if (options_.stop_after_step > 0 && step + 1 == options_.stop_after_step) break;
    }
    if (start_step_ >= cfg_.max_steps) complete_final_save();
    callbacks_.post_train(*this);
  } catch (const std::exception& e) {
    callbacks_.on_error(*this, e);
    throw;
  }
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

// ---- the step -------------------------------------------------------------------------------------

// The same in every parallel mode: what differs is the strategy's (train/gradient_strategy.h); what happens
// around the update is the callbacks' (train/callback.h).
StepStats Trainer::train_step(int64_t step) {
  RECORD_USER_SCOPE("archspace::train_step");  // one span per step in a profile (train.profile_steps)
  StepStats stats;
  stats.lr = LrSchedule::of(cfg_).at(step);
  std::vector<at::Tensor> ids;
  const std::vector<Batch> micro = assemble_micro_batches(step, ids);
  const int64_t labelled = global_labelled_tokens(step, micro);
  strategy_->begin_step(step, micro);
  // The step's bf16 weights go before the optimizer changes the fp32 ones: once the backwards are done, or when
  // this step throws before that.
  struct EndOfBackward {
    GradientStrategy& strategy;
    bool ended = false;
    void end() {
      if (!std::exchange(ended, true)) strategy.end_backward();
    }
    ~EndOfBackward() { end(); }
  } end_of_backward{*strategy_};
  const auto [ce, z] = forward_backward(step, micro, labelled);
  end_of_backward.end();  // the step's graph handles dropped before the optimizer's step
  record_batch(step, ce, z, labelled, ids, stats);
  callbacks_.post_backward(*this, step);  // e.g. gradient dumps
  // Before clipping: the gradients as backward made them (reduced already in data-parallel runs).
  if (every_interval(cfg_.grad_norm_interval, step + 1))
    stats.layer_grad_norms = strategy_->layer_grad_norms(model_->config().num_hidden_layers);
  stats.grad_norm = strategy_->clip_gradients(cfg_.clip_grad_norm);
  const int64_t G = global_batch();
  stats.source_counts = train_batches_->source_counts(static_cast<uint64_t>(step) * G, G);  // the global batch's
  tokens_seen_ += G * cfg_.sequence_length;
  // The stability policies: loss and gradient norm are global values here, so every rank decides the same.
  if (!callbacks_.pre_optim_step(*this, step, stats)) {
    strategy_->zero_gradients();  // no update from this batch
    stats.skipped = true;
    return stats;
  }
  strategy_->optimizer_step(stats.lr, cfg_.weight_decay);
  strategy_->zero_gradients();
  return stats;
}

// The loss is normalised by the labelled token count of the whole global batch, so accumulating micro-batches and
// summing over ranks (and over a sequence's context-parallel slices) gives the gradient of the whole batch.
int64_t Trainer::global_labelled_tokens(int64_t step, const std::vector<Batch>& micro) {
  int64_t labelled = 0;
  for (const Batch& b : micro) labelled += labelled_tokens(b);
  // SFT slices differ in labelled tokens: normalise by the global count.
  at::Tensor count = at::tensor({labelled}, at::kLong);
  strategy_->sum_over_ranks(count, "summing the labelled tokens of step " + std::to_string(step + 1));
  labelled = count.item<int64_t>();
  if (labelled == 0)
    throw Error("step " + std::to_string(step) +
                ": the batch has no labelled tokens (SFT examples without assistant tokens?)");
  return labelled;
}

// Each micro-batch's forward, loss and backward; the sums of this rank's cross-entropy and z-loss (in that order).
std::pair<double, double> Trainer::forward_backward(int64_t step, const std::vector<Batch>& micro, int64_t labelled) {
  double ce = 0, z = 0;
  for (size_t m = 0; m < micro.size(); ++m) {
    const Batch& b = micro[m];
    LossSums sums;
    {
      // The head runs in the loss (model/loss.h: chunk by chunk), under the forward's autocast.
      AutocastGuard autocast(autocast_, device_.type());
      const at::Tensor hidden = model_->forward(b.input_ids.to(device_), forward_options(true));
      sums = head_loss(hidden, strategy_->head_weight(), b.labels.to(device_), cfg_.z_loss, cfg_.loss_chunk_tokens,
                       strategy_->head_weight_cast());
    }
    const at::Tensor loss = (sums.ce_sum + sums.z_sum) / static_cast<double>(labelled);
    strategy_->backward(loss, step, m + 1 == micro.size());
    ce += sums.ce_sum.item<double>();
    z += sums.z_sum.item<double>();
  }
  return {ce, z};
}

// The global batch's losses per labelled token and its hash, as one process would report them.
void Trainer::record_batch(int64_t step, double ce, double z, int64_t labelled, const std::vector<at::Tensor>& ids,
                           StepStats& stats) {
  at::Tensor sums = at::tensor({ce, z}, at::kDouble);
  strategy_->sum_over_ranks(sums, "summing the losses of step " + std::to_string(step + 1));
  stats.loss = sums[0].item<double>() / labelled;
  stats.z_loss = sums[1].item<double>() / labelled;
  stats.batch_hash =
      batch_hash(strategy_->global_batch_ids(at::cat(ids), "gathering the batch of step " + std::to_string(step + 1)));
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
  forward.document_eos_id = document_eos_;     // validation sees the instances as training does
  forward.fp8 = cfg_.fp8;                      // and runs the block's matmuls in FP8 as training does
  forward.fused_kernels = cfg_.fused_kernels;  // and its fused kernels
  // FSDP: each unit's weights gathered as it runs; bf16 training: the step's casts.
  forward.parameters = strategy_->parameter_source(training);
  forward.sparse_embedding_gradient = strategy_->sparse_embedding_gradient(training);
  return forward;
}

// ---- what callbacks call ----------------------------------------------------------------------------

double Trainer::validation_loss(const Instances& valid) {
  c10::NoGradGuard no_grad;
  const int64_t B = cfg_.micro_batch, instances = static_cast<int64_t>(valid.instances_per_epoch());
  const int64_t batches = std::max<int64_t>(std::min<int64_t>(cfg_.eval_batches, instances / B), 1);
  double loss = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    Batch batch = window_batch(valid, b * B, std::min<int64_t>(B, instances));
    if (cp_) batch = cp_->slice(batch);  // the group's ranks evaluate the same batch, a slice each
    const at::Tensor hidden = model_->forward(batch.input_ids.to(device_), forward_options(false));
    const LossSums s = head_loss(hidden, strategy_->head_weight(), batch.labels.to(device_), 0, cfg_.loss_chunk_tokens);
    strategy_->release_after_forward();
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

// Rank 0 writes (all ranks hold the same weights and moments, so the checkpoint is the same whatever the
// number of ranks); the others wait for it at a barrier, so none runs ahead of the last saved step.
void Trainer::save_checkpoint(int64_t step, bool is_final) {
  NamedTensors opt_state = strategy_->optimizer_state();
  // FSDP: the whole fp32 parameters, gathered unit by unit into host memory (every rank takes part).
  const std::unique_ptr<CausalLM> whole = strategy_->whole_model(*model_, at::kCPU);
  if (rank_ == 0) {
    json state = {{"step", step},
                  {"tokens", tokens_seen_},
                  {"optimizer_steps", strategy_->optimizer().steps_taken()},
                  {"next_instance", static_cast<uint64_t>(step) * global_batch()},
                  {"seed", cfg_.seed},
                  {"variant", variant_name(model_->config().variant)},
                  {"sequence_length", cfg_.sequence_length},
                  {"global_batch", global_batch()},
                  {"micro_batch", cfg_.micro_batch},
                  {"grad_accum", cfg_.grad_accum},
                  {"world_size", world_},
                  {"context_parallel", cfg_.context_parallel},
                  {"shard_optimizer", strategy_->shards_optimizer()},
                  {"sharding", sharding_name(world_ > 1 ? cfg_.sharding : Sharding::kNone)},
                  {"replicate_groups", strategy_->replicate_groups()},
                  {"threads", at::get_num_threads()},
                  {"optim_recipe", recipe_fingerprint(cfg_)}};
    callbacks_.save_state(state);  // e.g. the spike policy's recent losses
    if (!mixture_fingerprint_.is_null()) state["data_mixture"] = mixture_fingerprint_;
    std::string config_text = cfg_.text;
    if (world_ > 1 && !config_text.empty())
      config_text += "\n# trained on " + std::to_string(data_parallel_size()) + " data-parallel ranks (world_size " +
                     std::to_string(world_) + (cp_ ? ", context_parallel " + std::to_string(cp_->degree()) : "") +
                     ", global batch " + std::to_string(global_batch()) + ")\n";
    last_checkpoint_ = archspace::save_checkpoint(
        cfg_.run_dir, step, {whole ? whole.get() : model_.get(), opt_state, state, config_text, tokenizer_file_},
        cfg_.keep_last, is_final);
  }
  // train.dist_timeout_s bounds this wait too: a hung rank 0 must not hold the others forever.
  if (dist_) dist_->barrier("the barrier after the checkpoint of step " + std::to_string(step), dist_->timeout());
  callbacks_.post_checkpoint_saved(*this, step, last_checkpoint_);
}

TrainResult run_training(const TrainConfig& config, const TrainOptions& options) {
  return Trainer(config, options).run();
}

}  // namespace archspace
