#include "archspace/config/train_config.h"

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "archspace/util/error.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

// Reads one table, remembering which keys were used, so that leftovers can be reported as unknown.
class Section {
 public:
  Section(const toml::table* t, std::string name, std::string source) : t_(t), name_(std::move(name)), source_(std::move(source)) {}

  template <typename T>
  void get(const char* key, T& out) {
    used_.insert(key);
    if (!t_) return;
    const toml::node* n = t_->get(key);
    if (!n) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!n->is_boolean()) fail(key, "must be true or false");
      out = n->as_boolean()->get();
    } else if constexpr (std::is_integral_v<T>) {
      if (!n->is_integer()) fail(key, "must be an integer");
      out = static_cast<T>(n->as_integer()->get());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (n->is_integer()) out = static_cast<T>(n->as_integer()->get());
      else if (n->is_floating_point()) out = n->as_floating_point()->get();
      else fail(key, "must be a number");
    } else {
      if (!n->is_string()) fail(key, "must be a string");
      out = n->as_string()->get();
    }
  }
  template <typename T>
  void get(const char* key, std::optional<T>& out) {
    used_.insert(key);
    if (!t_ || !t_->get(key)) return;
    T v{};
    get(key, v);
    out = v;
  }
  const toml::table* table(const char* key) {
    used_.insert(key);
    if (!t_) return nullptr;
    const toml::node* n = t_->get(key);
    if (n && !n->is_table()) fail(key, "must be a table");
    return n ? n->as_table() : nullptr;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": key '" + (name_.empty() ? "" : name_ + ".") + key + "' " + what);
  }
  void check_unknown() const {
    if (!t_) return;
    for (const auto& [k, v] : *t_) {
      if (!used_.count(std::string(k.str()))) {
        std::string known;
        for (const auto& u : used_) known += (known.empty() ? "" : ", ") + u;
        throw Error(source_ + ": unknown key '" + (name_.empty() ? "" : name_ + ".") + std::string(k.str()) + "' (known: " + known + ")");
      }
    }
  }

 private:
  const toml::table* t_;
  std::string name_, source_;
  std::set<std::string> used_;
};

}  // namespace

TrainConfig TrainConfig::load(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    throw Error(path + ": malformed TOML at " + where.str() + ": " + std::string(e.description()));
  }
  TrainConfig c;
  c.source = path;
  // Relative paths in the file are relative to the directory the command runs in (the repo root for
  // reproduce/...), which is what a user typing them expects.
  Section top(&root, "", path);
  const toml::table *model_t = top.table("model"), *data_t = top.table("data"), *train_t = top.table("train"),
                    *optim_t = top.table("optim"), *ckpt_t = top.table("checkpoint"), *eval_t = top.table("eval"),
                    *debug_t = top.table("debug");
  top.check_unknown();

  Section model(model_t, "model", path);
  model.get("preset", c.preset);
  model.get("config", c.model_config);
  model.get("variant", c.variant);
  model.get("use_siamese_norm", c.use_siamese_norm);
  model.get("use_depth_attention", c.use_depth_attention);
  model.get("depth_attention_stride", c.depth_attention_stride);
  model.get("depth_attention_recent_window", c.depth_attention_recent_window);
  model.get("init_from", c.init_from);
  model.get("max_position_embeddings", c.max_position_embeddings);
  if (const toml::table* y = model.table("rope_scaling")) {
    Section yarn(y, "model.rope_scaling", path);
    std::string type = "yarn";
    YarnScaling s;
    int64_t original = 0;
    yarn.get("type", type);
    yarn.get("factor", s.factor);
    yarn.get("original_max_position_embeddings", original);
    yarn.get("beta_fast", s.beta_fast);
    yarn.get("beta_slow", s.beta_slow);
    yarn.get("attention_factor", s.attention_factor);
    yarn.check_unknown();
    if (type != "yarn") yarn.fail("type", "must be \"yarn\"");
    if (original <= 0) yarn.fail("original_max_position_embeddings", "is required and must be positive");
    s.original_max_position_embeddings = original;
    c.rope_scaling = s;
  }
  model.check_unknown();

  Section data(data_t, "data", path);
  data.get("train", c.train_data);
  data.get("valid", c.valid_data);
  data.get("format", c.format);
  data.get("tokenizer", c.tokenizer);
  data.get("shuffle", c.shuffle);
  data.check_unknown();

  Section train(train_t, "train", path);
  train.get("run_dir", c.run_dir);
  train.get("sequence_length", c.sequence_length);
  train.get("micro_batch", c.micro_batch);
  train.get("grad_accum", c.grad_accum);
  train.get("max_steps", c.max_steps);
  train.get("seed", c.seed);
  train.get("device", c.device);
  train.get("dtype", c.dtype);
  train.get("threads", c.threads);
  train.check_unknown();

  Section optim(optim_t, "optim", path);
  optim.get("lr", c.lr);
  optim.get("beta1", c.beta1);
  optim.get("beta2", c.beta2);
  optim.get("eps", c.eps);
  optim.get("weight_decay", c.weight_decay);
  optim.get("decay_norms", c.decay_norms);
  optim.get("decay_embeddings", c.decay_embeddings);
  optim.get("warmup_steps", c.warmup_steps);
  optim.get("final_lr_factor", c.final_lr_factor);
  optim.get("clip_grad_norm", c.clip_grad_norm);
  optim.get("z_loss", c.z_loss);
  optim.check_unknown();

  Section ckpt(ckpt_t, "checkpoint", path);
  ckpt.get("interval", c.checkpoint_interval);
  ckpt.get("keep_last", c.keep_last);
  ckpt.check_unknown();

  Section eval(eval_t, "eval", path);
  eval.get("interval", c.eval_interval);
  eval.get("batches", c.eval_batches);
  eval.check_unknown();

  Section debug(debug_t, "debug", path);
  debug.get("dump_gradients_steps", c.dump_gradients_steps);
  debug.check_unknown();

  auto require = [&](bool ok, const std::string& key, const std::string& what) {
    if (!ok) throw Error(path + ": key '" + key + "' " + what);
  };
  require(!c.run_dir.empty(), "train.run_dir", "is required");
  require(!c.train_data.empty(), "data.train", "is required");
  require(c.sequence_length >= 2, "train.sequence_length", "is required and must be >= 2");
  require(c.micro_batch >= 1, "train.micro_batch", "must be >= 1");
  require(c.grad_accum >= 1, "train.grad_accum", "must be >= 1");
  require(c.max_steps >= 1, "train.max_steps", "is required and must be >= 1");
  require(c.format == "tokens" || c.format == "chat", "data.format", "must be \"tokens\" or \"chat\"");
  require(c.dtype == "fp32" || c.dtype == "bf16", "train.dtype", "must be \"fp32\" or \"bf16\"");
  require(c.variant == "base" || c.variant == "siamese_depth", "model.variant", "must be \"base\" or \"siamese_depth\"");
  require(c.lr > 0, "optim.lr", "must be positive");
  require(c.warmup_steps >= 0 && c.warmup_steps <= c.max_steps, "optim.warmup_steps", "must be in [0, train.max_steps]");
  require(c.final_lr_factor >= 0 && c.final_lr_factor <= 1, "optim.final_lr_factor", "must be in [0, 1]");
  require(c.keep_last >= 1, "checkpoint.keep_last", "must be >= 1");
  const int sources = !c.preset.empty() + !c.model_config.empty();
  require(sources <= 1, "model.preset", "and model.config are exclusive");
  require(sources == 1 || !c.init_from.empty(), "model.preset", "(or model.config, or model.init_from) is required");
  if (!fs::exists(c.train_data)) throw Error(path + ": key 'data.train': '" + c.train_data + "' does not exist");
  if (!c.valid_data.empty() && !fs::exists(c.valid_data)) throw Error(path + ": key 'data.valid': '" + c.valid_data + "' does not exist");
  return c;
}

ModelConfig TrainConfig::model() const {
  const Variant v = variant == "base" ? Variant::kBase : Variant::kSiameseDepth;
  ModelConfig m = !model_config.empty() ? ModelConfig::load(model_config) : archspace::preset(preset, v);
  if (!model_config.empty() && m.variant != v) {
    throw Error(source + ": key 'model.variant' is \"" + variant + "\" but " + model_config + " is " + variant_name(m.variant));
  }
  if (use_siamese_norm || use_depth_attention || depth_attention_stride || depth_attention_recent_window) {
    if (m.variant != Variant::kSiameseDepth) throw Error(source + ": the SiameseNorm/Depth-Attention keys need model.variant = \"siamese_depth\"");
  }
  if (use_siamese_norm) m.use_siamese_norm = *use_siamese_norm;
  if (use_depth_attention) m.use_depth_attention = *use_depth_attention;
  if (depth_attention_stride) m.depth_attention_stride = *depth_attention_stride;
  if (depth_attention_recent_window) m.depth_attention_recent_window = *depth_attention_recent_window;
  if (rope_scaling) m.rope_scaling = rope_scaling;
  if (max_position_embeddings) m.max_position_embeddings = *max_position_embeddings;
  m.validate(source);
  return m;
}

}  // namespace archspace
