#include "archspace/config/train_config.h"

#include <toml++/toml.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

enum class KeyType { kBool, kInt, kFloat, kString, kStringList, kIntList, kTable };

const char* expected(KeyType t) {
  switch (t) {
    case KeyType::kBool:
      return "true or false";
    case KeyType::kInt:
      return "an integer";
    case KeyType::kFloat:
      return "a number";
    case KeyType::kString:
      return "a string";
    case KeyType::kStringList:
      return "a list of strings";
    case KeyType::kIntList:
      return "a list of integers";
    case KeyType::kTable:
      return "a table";
  }
  return "";
}

// Every key the reader asks for, "section.key" -> type. Recorded by reading an empty table, so the
// overrides are checked against exactly the keys (and types) the TOML reader accepts.
using KeySchema = std::map<std::string, KeyType>;

// Reads one table, remembering which keys were used, so that leftovers can be reported as unknown.
class Section {
 public:
  Section(const toml::table* t, std::string name, std::string source, KeySchema* schema)
      : t_(t), name_(std::move(name)), source_(std::move(source)), schema_(schema) {}

  template <typename T>
  void get(const char* key, T& out) {
    note(key, type_of<T>());
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
      if (n->is_integer())
        out = static_cast<T>(n->as_integer()->get());
      else if (n->is_floating_point())
        out = n->as_floating_point()->get();
      else
        fail(key, "must be a number");
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      const toml::array* a = n->as_array();
      if (!a) fail(key, "must be a list of strings");
      out.clear();
      for (const auto& item : *a) {
        if (!item.is_string()) fail(key, "must be a list of strings");
        out.push_back(item.as_string()->get());
      }
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      const toml::array* a = n->as_array();
      if (!a) fail(key, "must be a list of integers");
      out.clear();
      for (const auto& item : *a) {
        if (!item.is_integer()) fail(key, "must be a list of integers");
        out.push_back(item.as_integer()->get());
      }
    } else {
      if (!n->is_string()) fail(key, "must be a string");
      out = n->as_string()->get();
    }
  }
  template <typename T>
  void get(const char* key, std::optional<T>& out) {
    T v{};
    get(key, v);
    if (t_ && t_->get(key)) out = v;
  }
  const toml::table* table(const char* key) {
    note(key, KeyType::kTable);
    if (!t_) return nullptr;
    const toml::node* n = t_->get(key);
    if (n && !n->is_table()) fail(key, "must be a table");
    return n ? n->as_table() : nullptr;
  }
  // An array of tables ([[section.key]]), each read by `read(section, index)`.
  template <typename Read>
  void tables(const char* key, Read read) {
    note(key, KeyType::kTable);  // --set refuses it: tables are set in the file
    if (!t_) return;
    const toml::node* n = t_->get(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) fail(key, "must be an array of tables ([[" + full(key) + "]])");
    for (size_t i = 0; i < a->size(); ++i) {
      const std::string name = full(key) + "[" + std::to_string(i) + "]";
      if (!(*a)[i].is_table()) throw Error(source_ + ": key '" + name + "' must be a table");
      Section item((*a)[i].as_table(), name, source_, nullptr);
      read(item, i);
      item.check_unknown();
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": key '" + full(key) + "' " + what);
  }
  void check_unknown() const {
    if (!t_) return;
    for (const auto& [k, v] : *t_) {
      if (!used_.count(std::string(k.str()))) {
        std::string known;
        for (const auto& u : used_) known += (known.empty() ? "" : ", ") + u;
        throw Error(source_ + ": unknown key '" + full(std::string(k.str())) + "' (known: " + known + ")");
      }
    }
  }

 private:
  template <typename T>
  static KeyType type_of() {
    if constexpr (std::is_same_v<T, bool>)
      return KeyType::kBool;
    else if constexpr (std::is_integral_v<T>)
      return KeyType::kInt;
    else if constexpr (std::is_floating_point_v<T>)
      return KeyType::kFloat;
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      return KeyType::kStringList;
    else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
      return KeyType::kIntList;
    else
      return KeyType::kString;
  }
  std::string full(const std::string& key) const { return name_.empty() ? key : name_ + "." + key; }
  void note(const char* key, KeyType type) {
    used_.insert(key);
    if (schema_) (*schema_)[full(key)] = type;
  }

  const toml::table* t_;
  std::string name_, source_;
  KeySchema* schema_;
  std::set<std::string> used_;
};

// The keys whose text becomes an enum; parsed after reading, with the key named in errors.
struct ChoiceTexts {
  std::string variant = "base", format = "tokens", device = "cpu", dtype = "fp32", nonfinite = "stop";
  std::optional<std::string> norm_topology, sharding;
  std::optional<bool> shard_optimizer;          // the older spelling of sharding = "optimizer"
  std::optional<bool> reduce_each_micro_batch;  // only with sharding = "full"
  // [optim]: the recipe, and the keys whose defaults are the recipe's (config/recipe.h).
  std::string recipe = "olmo-core", schedule = "cosine", wsd_decay_shape = "linear";
  std::optional<std::string> schedule_convention;
  std::optional<bool> decay_norms, decay_embeddings, skip_steps;
  std::string data_order = "archspace";
  std::optional<std::string> init;  // model.init
};

// Reads every key of `root` into `c` (no cross-key validation). With `schema`, records the keys read.
ChoiceTexts read_keys(const toml::table& root, TrainConfig& c, const std::string& path, KeySchema* schema) {
  ChoiceTexts choices;
  Section top(&root, "", path, schema);
  const toml::table *model_t = top.table("model"), *data_t = top.table("data"), *train_t = top.table("train"),
                    *optim_t = top.table("optim"), *ckpt_t = top.table("checkpoint"), *eval_t = top.table("eval"),
                    *debug_t = top.table("debug"), *log_t = top.table("log");
  top.check_unknown();

  Section model(model_t, "model", path, schema);
  model.get("preset", c.preset);
  model.get("config", c.model_config);
  model.get("variant", choices.variant);
  model.get("use_siamese_norm", c.switches.use_siamese_norm);
  model.get("use_depth_attention", c.switches.use_depth_attention);
  model.get("depth_attention_stride", c.switches.depth_attention_stride);
  model.get("depth_attention_recent_window", c.switches.depth_attention_recent_window);
  model.get("norm_topology", choices.norm_topology);
  model.get("init", choices.init);
  model.get("siamese_depth_scaling", c.switches.siamese_depth_scaling);
  model.get("siamese_normalized_input", c.switches.siamese_normalized_input);
  model.get("init_from", c.init_from);
  model.get("max_position_embeddings", c.max_position_embeddings);
  if (const toml::table* y = model.table("rope_scaling")) {
    Section yarn(y, "model.rope_scaling", path, nullptr);
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

  Section data(data_t, "data", path, schema);
  data.get("train", c.train_data);
  data.get("valid", c.valid_data);
  data.get("token_dtype", c.token_dtype);
  data.get("format", choices.format);
  data.get("tokenizer", c.tokenizer);
  data.get("shuffle", c.shuffle);
  data.get("mix_tokens", c.mix_tokens);
  data.tables("sources", [&](Section& item, size_t) {
    DataSourceConfig src;
    std::optional<std::string> one;
    std::optional<std::vector<std::string>> many;
    item.get("name", src.name);
    item.get("path", one);
    item.get("paths", many);
    item.get("ratio", src.ratio);
    item.get("max_repetition", src.max_repetition);
    if (one && many) item.fail("path", "and 'paths' are exclusive (one path, or a list of them)");
    if (!one && !many) item.fail("path", "is required (or 'paths', a list)");
    if (one && one->empty()) item.fail("path", "must not be empty");
    if (many && many->empty()) item.fail("paths", "must list at least one path");
    src.paths = one ? std::vector<std::string>{*one} : *many;
    c.sources.push_back(std::move(src));
  });
  data.check_unknown();

  Section train(train_t, "train", path, schema);
  train.get("run_dir", c.run_dir);
  train.get("sequence_length", c.sequence_length);
  train.get("micro_batch", c.micro_batch);
  train.get("grad_accum", c.grad_accum);
  train.get("max_steps", c.max_steps);
  train.get("seed", c.seed);
  train.get("device", choices.device);
  train.get("dtype", choices.dtype);
  train.get("fp8", c.fp8);
  train.get("fused_kernels", c.fused_kernels);
  train.get("threads", c.threads);
  train.get("dist_timeout_s", c.dist_timeout_s);
  train.get("sharding", choices.sharding);
  train.get("shard_optimizer", choices.shard_optimizer);
  train.get("replicate_groups", c.replicate_groups);
  train.get("reduce_each_micro_batch", choices.reduce_each_micro_batch);
  train.get("context_parallel", c.context_parallel);
  train.get("nonfinite", choices.nonfinite);
  train.get("log_all_ranks", c.log_all_ranks);
  train.get("grad_norm_interval", c.grad_norm_interval);
  train.get("spike_factor", c.spike_factor);
  train.get("spike_window", c.spike_window);
  train.get("spike", c.spike_policy);
  train.get("activation_checkpointing", c.activation_checkpointing);
  train.get("document_masking", c.document_masking);
  train.get("profile_steps", c.profile_steps);
  train.get("loss_chunk_tokens", c.loss_chunk_tokens);
  train.get("data_order", choices.data_order);
  train.check_unknown();

  Section optim(optim_t, "optim", path, schema);
  optim.get("lr", c.lr);
  optim.get("beta1", c.beta1);
  optim.get("beta2", c.beta2);
  optim.get("eps", c.eps);
  optim.get("weight_decay", c.weight_decay);
  optim.get("fused", c.fused);
  optim.get("recipe", choices.recipe);
  optim.get("decay_norms", choices.decay_norms);
  optim.get("decay_embeddings", choices.decay_embeddings);
  optim.get("schedule", choices.schedule);
  optim.get("schedule_convention", choices.schedule_convention);
  optim.get("warmup_steps", c.warmup_steps);
  optim.get("final_lr_factor", c.final_lr_factor);
  optim.get("decay_steps", c.decay_steps);
  optim.get("wsd_decay_shape", choices.wsd_decay_shape);
  optim.get("skip_steps", choices.skip_steps);
  optim.get("skip_step_window", c.skip_step_window);
  optim.get("skip_step_sigma", c.skip_step_sigma);
  optim.get("clip_grad_norm", c.clip_grad_norm);
  optim.get("z_loss", c.z_loss);
  optim.check_unknown();

  Section ckpt(ckpt_t, "checkpoint", path, schema);
  ckpt.get("interval", c.checkpoint_interval);
  ckpt.get("keep_last", c.keep_last);
  ckpt.check_unknown();

  Section eval(eval_t, "eval", path, schema);
  eval.get("interval", c.eval_interval);
  eval.get("batches", c.eval_batches);
  eval.get("downstream", c.downstream);
  eval.get("downstream_format", c.downstream_format);
  eval.get("downstream_shots", c.downstream_shots);
  eval.get("downstream_limit", c.downstream_limit);
  eval.tables("sources", [&](Section& item, size_t) {
    EvalSourceConfig src;
    item.get("name", src.name);
    item.get("path", src.path);
    if (src.path.empty()) item.fail("path", "is required");
    c.eval_sources.push_back(std::move(src));
  });
  eval.check_unknown();

  Section log(log_t, "log", path, schema);
  log.get("tensorboard", c.log.tensorboard);
  if (const toml::table* w = log.table("wandb")) {
    Section wandb(w, "log.wandb", path, nullptr);  // set in the file, not by --set (a table)
    c.log.wandb.enabled = true;
    wandb.get("project", c.log.wandb.project);
    wandb.get("name", c.log.wandb.name);
    wandb.get("mode", c.log.wandb.mode);
    wandb.check_unknown();
    const std::string& mode = c.log.wandb.mode;
    if (mode != "offline" && mode != "online" && mode != "disabled")
      wandb.fail("mode", "must be \"offline\", \"online\" or \"disabled\", not \"" + mode + "\"");
    if (c.log.wandb.project.empty()) wandb.fail("project", "must not be empty");
  }
  log.check_unknown();

  Section debug(debug_t, "debug", path, schema);
  debug.get("dump_gradients_steps", c.dump_gradients_steps);
  debug.check_unknown();
  return choices;
}

const KeySchema& key_schema() {
  static const KeySchema schema = [] {
    KeySchema s;
    TrainConfig scratch;
    read_keys(toml::table{}, scratch, "", &s);
    return s;
  }();
  return schema;
}

// Sets one "section.key=value" in the parsed table, as the key's type.
void apply_override(toml::table& root, const std::string& text, const std::string& path) {
  const std::string where = path + ": override '" + text + "'";
  auto fail = [&](const std::string& what) -> Error { return Error(where + ": " + what); };
  const size_t eq = text.find('=');
  const std::string key = text.substr(0, eq);
  const size_t dot = key.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == key.size()) {
    throw fail("expected section.key=value (e.g. train.max_steps=100)");
  }
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1), value = text.substr(eq + 1);
  const KeySchema& schema = key_schema();
  auto listed = [&](const std::string& prefix) {
    std::string known;
    for (const auto& [k, t] : schema) {
      if (k.rfind(prefix, 0) == 0 && k.find('.', prefix.size()) == std::string::npos)
        known += (known.empty() ? "" : ", ") + k.substr(prefix.size());
    }
    return known;
  };
  auto s = schema.find(section);
  if (s == schema.end() || s->second != KeyType::kTable)
    throw fail("unknown section '" + section + "' (known: " + listed("") + ")");
  auto k = schema.find(key);
  if (k == schema.end()) throw fail("unknown key '" + key + "' (known: " + listed(section + ".") + ")");
  const KeyType type = k->second;
  auto wrong = [&]() -> Error { return fail("key '" + key + "' expects " + expected(type) + ", not '" + value + "'"); };

  toml::node* existing = root.get(section);
  if (existing && !existing->is_table()) throw fail("'" + section + "' in the file is not a table");
  if (!existing) existing = &root.insert_or_assign(section, toml::table{}).first->second;
  toml::table& table = *existing->as_table();
  switch (type) {
    case KeyType::kBool:
      if (value != "true" && value != "false") throw wrong();
      table.insert_or_assign(name, value == "true");
      break;
    case KeyType::kInt: {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size()) throw wrong();
      table.insert_or_assign(name, v);
      break;
    }
    case KeyType::kFloat: {
      char* end = nullptr;
      const double v =
          value.empty() || std::isspace(static_cast<unsigned char>(value[0])) ? 0 : std::strtod(value.c_str(), &end);
      if (!end || *end != '\0') throw wrong();
      table.insert_or_assign(name, v);
      break;
    }
    case KeyType::kString:
      table.insert_or_assign(name, value);
      break;
    case KeyType::kStringList: {  // "a,b,c" (empty: an empty list)
      toml::array items;
      for (const std::string& item : split_nonempty(value, ',')) items.push_back(item);
      table.insert_or_assign(name, std::move(items));
      break;
    }
    case KeyType::kIntList: {  // "3,5" (empty: an empty list)
      toml::array items;
      for (const std::string& item : split_nonempty(value, ',')) {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (ec != std::errc() || end != item.data() + item.size()) throw wrong();
        items.push_back(v);
      }
      table.insert_or_assign(name, std::move(items));
      break;
    }
    case KeyType::kTable:
      throw fail("key '" + key + "' is a table; set it in the TOML file");
  }
}

// Replaces "{variant}" in every string value (run_dir, init_from, [[data.sources]] paths, ...) so that one
// stage file serves both variants. Returns whether anything changed.
bool substitute_variant(toml::node& node, const std::string& variant) {
  static const std::string placeholder = "{variant}";
  bool changed = false;
  if (auto* s = node.as_string()) {
    std::string& v = s->get();
    for (size_t at = v.find(placeholder); at != std::string::npos; at = v.find(placeholder, at + variant.size())) {
      v.replace(at, placeholder.size(), variant);
      changed = true;
    }
  } else if (auto* table = node.as_table()) {
    for (auto&& [k, child] : *table) changed = substitute_variant(child, variant) || changed;
  } else if (auto* items = node.as_array()) {
    for (auto& child : *items) changed = substitute_variant(child, variant) || changed;
  }
  return changed;
}

// "section.key" -> the --set text that gave it its value (the last one wins, as in apply_override).
using Overrides = std::map<std::string, std::string>;

Overrides overridden_keys(const std::vector<std::string>& overrides) {
  Overrides out;
  for (const auto& o : overrides) out[o.substr(0, o.find('='))] = o;
  return out;
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A rule over two keys that failed: the message names where each value came from (an override, or the file),
// both values, and `fix`; an override is blamed before the file it was applied to.
[[noreturn]] void conflict(const std::string& path, const Overrides& set, const std::string& a, double va,
                           const std::string& b, double vb, const std::string& rule, const std::string& fix) {
  auto origin = [&](const std::string& k, double v) {
    auto o = set.find(k);
    return o != set.end() ? "--set " + o->second : path + "'s " + k + " = " + number_text(v);
  };
  const bool any_override = set.count(a) || set.count(b);
  const std::string values = a + " = " + number_text(va) + ", " + b + " = " + number_text(vb);
  if (!any_override) throw Error(path + ": key '" + a + "' " + rule + " (" + values + "): " + fix);
  // The override first: it is what the user just typed.
  const bool a_first = set.count(a) > 0;
  const std::string first = a_first ? origin(a, va) : origin(b, vb), second = a_first ? origin(b, vb) : origin(a, va);
  throw Error(first + " conflicts with " + second + ": " + a + " " + rule + " (" + values + "); " + fix);
}

// Source names become metric keys (valid/NAME/loss, source_tokens.NAME) and tracker tags: plain words only.
bool plain_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (unsigned char ch : name)
    if (!std::isalnum(ch) && ch != '_' && ch != '-' && ch != '.') return false;
  return true;
}

// [[data.sources]], data.mix_tokens and [[eval.sources]].
template <typename Key, typename Exists>
void validate_mixture(const TrainConfig& c, const std::string& path, const Key& key, const Exists& exists) {
  auto item_key = [&](const char* table, size_t i, const char* field) {
    return path + ": key '" + table + "[" + std::to_string(i) + "]." + field + "'";
  };
  auto check_names = [&](const char* table, const std::vector<std::string>& names) {
    std::set<std::string> seen;
    for (size_t i = 0; i < names.size(); ++i) {
      if (!plain_name(names[i])) {
        throw Error(item_key(table, i, "name") + " must be 1 to 64 letters, digits, '_', '-' or '.', not \"" +
                    names[i] + "\"");
      }
      if (!seen.insert(names[i]).second)
        throw Error(item_key(table, i, "name") + ": \"" + names[i] + "\" names two sources; names must be unique");
    }
  };
  if (c.mix_tokens < 0) throw Error(key("data.mix_tokens") + " must be >= 1 (or 0: the run's tokens)");
  if (c.mix_tokens > 0 && c.sources.empty())
    throw Error(key("data.mix_tokens") + " is the token budget of a mixture, and there is no [[data.sources]]");
  if (!c.sources.empty()) {
    if (c.format != DataFormat::kTokens)
      throw Error(key("data.format") + " must be \"tokens\" for a mixture ([[data.sources]])");
    std::vector<std::string> names;
    for (const auto& s : c.sources) names.push_back(s.name);
    check_names("data.sources", names);
    double sum = 0;
    std::string terms;
    for (size_t i = 0; i < c.sources.size(); ++i) {
      const DataSourceConfig& s = c.sources[i];
      if (!std::isfinite(s.ratio) || s.ratio <= 0 || s.ratio > 1)
        throw Error(item_key("data.sources", i, "ratio") + " must be in (0, 1], got " + number_text(s.ratio));
      if (!std::isfinite(s.max_repetition) || s.max_repetition < 1) {
        throw Error(item_key("data.sources", i, "max_repetition") + " must be a finite number >= 1, got " +
                    number_text(s.max_repetition));
      }
      for (const std::string& p : s.paths) {
        if (!exists(p)) {
          throw Error(item_key("data.sources", i, s.paths.size() == 1 ? "path" : "paths") + ": '" + p +
                      "' does not exist");
        }
      }
      sum += s.ratio;
      terms += (terms.empty() ? "" : " + ") + number_text(s.ratio);
    }
    if (std::abs(sum - 1) > 1e-6) {
      std::ostringstream total;
      total.precision(9);
      total << sum;
      throw Error(path + ": key 'data.sources': the ratios sum to " + total.str() + " (" + terms +
                  "), not 1 (within 1e-6)");
    }
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < c.eval_sources.size(); ++i) {
    names.push_back(c.eval_sources[i].name);
    if (!exists(c.eval_sources[i].path))
      throw Error(item_key("eval.sources", i, "path") + ": '" + c.eval_sources[i].path + "' does not exist");
  }
  check_names("eval.sources", names);
  if (!c.eval_sources.empty() && c.format != DataFormat::kTokens)
    throw Error(key("data.format") + " must be \"tokens\" for [[eval.sources]]");
}

// optim.recipe sets the defaults of the keys it names (config/recipe.h); the keys given override them. Then the
// schedule's own limits, as its trainer's class asserts them.
template <typename Key>
void resolve_recipe(TrainConfig& c, const ChoiceTexts& choices, const Key& key) {
  c.recipe = parse_recipe(choices.recipe, key("optim.recipe"));
  const RecipeDefaults d = recipe_defaults(c.recipe);
  c.schedule_convention = choices.schedule_convention ? parse_schedule_convention(*choices.schedule_convention,
                                                                                  key("optim.schedule_convention"))
                                                      : d.convention;
  c.decay_norms = choices.decay_norms.value_or(d.decay_norms);
  c.decay_embeddings = choices.decay_embeddings.value_or(d.decay_embeddings);
  c.skip_steps = choices.skip_steps.value_or(d.skip_steps);
  c.schedule = parse_schedule_shape(choices.schedule, key("optim.schedule"));
  c.wsd_decay_shape = parse_wsd_decay_shape(choices.wsd_decay_shape, key("optim.wsd_decay_shape"));
  const std::string convention = std::string("\"") + convention_name(c.schedule_convention) + "\"";
  if (c.schedule_convention == ScheduleConvention::kArchspace && c.schedule != ScheduleShape::kCosine)
    throw Error(key("optim.schedule") + " = \"" + choices.schedule +
                "\" has no archspace form (that convention is its cosine only); use optim.schedule_convention = " +
                "\"olmo-core\" or \"megatron\"");
  if (c.schedule_convention == ScheduleConvention::kOlmoCore && c.wsd_decay_shape != WsdDecayShape::kLinear)
    throw Error(key("optim.wsd_decay_shape") + " = \"" + choices.wsd_decay_shape +
                "\": OLMo-core's WSD decays linearly; the other shapes are Megatron's (optim.schedule_convention = "
                "\"megatron\")");
  // OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps.
  if (c.schedule_convention == ScheduleConvention::kMegatron && c.warmup_steps >= c.max_steps)
    throw Error(key("optim.warmup_steps") + " = " + std::to_string(c.warmup_steps) +
                " must be below train.max_steps (" + std::to_string(c.max_steps) + ") under the " + convention +
                " schedule convention (Megatron's warm-up ends before its decay)");
  if (c.schedule == ScheduleShape::kWsd) {
    const int64_t decay = c.decay_steps.value_or(default_wsd_decay_steps(c.max_steps));
    if (decay < 1 || decay > c.max_steps)
      throw Error(key("optim.decay_steps") + " = " + std::to_string(decay) +
                  (c.decay_steps ? "" : " (10% of train.max_steps, rounded)") + " must be in [1, train.max_steps = " +
                  std::to_string(c.max_steps) + "] for optim.schedule = \"wsd\"");
  } else if (c.decay_steps) {
    throw Error(key("optim.decay_steps") + " applies to optim.schedule = \"wsd\" only (it is \"" + choices.schedule +
                "\")");
  }
  // Judging starts at window / 2 values: below 6, one earlier value would give an undefined deviation (NaN), which
  // OLMo-core's rule reads as "skip" for every step.
  if (c.skip_step_window < 6)
    throw Error(key("optim.skip_step_window") + " must be >= 6, got " + std::to_string(c.skip_step_window));
  if (!(std::isfinite(c.skip_step_sigma) && c.skip_step_sigma > 0))
    throw Error(key("optim.skip_step_sigma") + " must be a finite number > 0");
}

void validate(TrainConfig& c, const ChoiceTexts& choices, const std::string& path, const Overrides& set) {
  // A key given by --set is blamed on the override, not on the file.
  auto key = [&](const char* k) {
    auto o = set.find(k);
    return (o != set.end() ? "--set " + o->second + " (on " + path + ")" : path) + ": key '" + k + "'";
  };
  c.variant = parse_variant(choices.variant, key("model.variant"));
  if (choices.norm_topology)
    c.switches.norm_topology = parse_norm_topology(*choices.norm_topology, key("model.norm_topology"));
  c.format = parse_data_format(choices.format, key("data.format"));
  c.device = parse_device(choices.device, key("train.device"));
  c.dtype = parse_dtype(choices.dtype, key("train.dtype"));
  if (c.fp8 && c.dtype != DType::kBf16) {
    throw Error(key("train.fp8") + " = true needs train.dtype = \"bf16\" (FP8 block matmuls, bf16 autocast around " +
                "them), it is \"" + choices.dtype + "\"");
  }
  if (choices.nonfinite != "stop" && choices.nonfinite != "skip") {
    throw Error(key("train.nonfinite") + ": unknown policy '" + choices.nonfinite + "' (valid: stop, skip)");
  }
  c.skip_nonfinite_steps = choices.nonfinite == "skip";
  // train.shard_optimizer = true is the older spelling of train.sharding = "optimizer"; both may be given
  // only when they agree.
  c.sharding = choices.sharding ? parse_sharding(*choices.sharding, key("train.sharding"))
                                : (choices.shard_optimizer.value_or(false) ? Sharding::kOptimizer : Sharding::kNone);
  if (choices.sharding && choices.shard_optimizer && *choices.shard_optimizer != (c.sharding == Sharding::kOptimizer)) {
    throw Error(key("train.shard_optimizer") + " is " + (*choices.shard_optimizer ? "true" : "false") +
                " but train.sharding is \"" + *choices.sharding +
                "\": they disagree (shard_optimizer = true means sharding = \"optimizer\"); keep train.sharding alone");
  }
  auto require = [&](bool ok, const char* k, const std::string& what) {
    if (!ok) throw Error(key(k) + " " + what);
  };
  require(c.spike_policy == "record" || c.spike_policy == "skip" || c.spike_policy == "stop", "train.spike",
          "is an unknown policy '" + c.spike_policy + "' (valid: record, skip, stop)");
  require(c.grad_norm_interval >= 0, "train.grad_norm_interval", "must be >= 0 (0: off)");
  require(c.loss_chunk_tokens >= 0, "train.loss_chunk_tokens",
          "must be >= 0 (0: the logits of a whole micro-batch at once)");
  require(std::isfinite(c.spike_factor) && (c.spike_factor == 0 || c.spike_factor > 1), "train.spike_factor",
          "must be 0 (off) or a finite number > 1");
  require(c.spike_window >= 1, "train.spike_window", "must be >= 1");
  require(c.profile_steps.empty() ||
              (c.profile_steps.size() == 2 && c.profile_steps[0] >= 1 && c.profile_steps[0] <= c.profile_steps[1]),
          "train.profile_steps", "must be [first, last] with 1 <= first <= last (steps counted from 1), or []");
  // Chat examples are one per instance (padded, never packed): there are no documents to keep apart.
  require(!c.document_masking || c.format == DataFormat::kTokens, "train.document_masking",
          "applies to packed token data (data.format = \"tokens\"); chat examples are one per instance already");
  require(!c.run_dir.empty(), "train.run_dir", "is required");
  require(!c.train_data.empty() || !c.sources.empty(), "data.train", "is required (or a mixture, [[data.sources]])");
  require(c.train_data.empty() || c.sources.empty(), "data.train",
          "and [[data.sources]] are exclusive (a mixture names its sources' paths)");
  require(c.sequence_length >= 2, "train.sequence_length", "is required and must be >= 2");
  require(c.micro_batch >= 1, "train.micro_batch", "must be >= 1");
  require(c.context_parallel >= 1 && c.context_parallel <= (1 << 16), "train.context_parallel",
          "must be in [1, 65536] (1: off), got " + std::to_string(c.context_parallel));
  require(c.sequence_length % c.context_parallel == 0, "train.context_parallel",
          "= " + std::to_string(c.context_parallel) + " must divide train.sequence_length " +
              std::to_string(c.sequence_length) + " (each rank takes an equal contiguous slice)");
  // Not yet combined (docs/distributed.md, "Context parallelism"): a slice's documents would need their
  // boundaries from the other slices, and FSDP's shard group would have to fold in the context-parallel ranks.
  require(c.context_parallel == 1 || !c.document_masking, "train.document_masking",
          "is not supported with train.context_parallel > 1 (" + std::to_string(c.context_parallel) +
              ") yet: a slice would need the document boundaries of the slices before it");
  require(c.grad_accum >= 1, "train.grad_accum", "must be >= 1");
  require(c.dist_timeout_s >= 1, "train.dist_timeout_s", "must be >= 1");
  require(c.replicate_groups >= 1 && c.replicate_groups <= (1 << 20), "train.replicate_groups",
          "must be >= 1, got " + std::to_string(c.replicate_groups));
  require(!choices.reduce_each_micro_batch || c.sharding == Sharding::kFull, "train.reduce_each_micro_batch",
          std::string("applies to train.sharding = \"full\" only (it is \"") + sharding_name(c.sharding) +
              "\", which reduces the accumulated gradients once per step)");
  c.reduce_each_micro_batch = choices.reduce_each_micro_batch.value_or(true);
  require(c.replicate_groups == 1 || c.sharding == Sharding::kFull, "train.replicate_groups",
          "is " + std::to_string(c.replicate_groups) +
              ": HSDP replicates shard groups of train.sharding = \"full\" (it is \"" + sharding_name(c.sharding) +
              "\")");
  require(c.max_steps >= 1, "train.max_steps", "is required and must be >= 1");
  require(c.lr > 0, "optim.lr", "must be positive");
  require(c.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0");
  if (c.warmup_steps > c.max_steps) {
    const std::string steps = std::to_string(c.max_steps);
    const std::string warmup = std::to_string(c.warmup_steps);
    std::string fix;
    if (set.count("optim.warmup_steps"))  // the user's own warmup is too long
      fix = "give optim.warmup_steps at most " + steps + ", or --set train.max_steps=" + warmup + " (or more)";
    else if (set.count("train.max_steps"))  // a shorter run than the file's: the file's warmup must follow
      fix = "pass --set optim.warmup_steps=" + std::to_string(c.max_steps / 10) + " (any value <= " + steps +
            ") as well, or a train.max_steps of at least " + warmup;
    else
      fix = "lower optim.warmup_steps to at most " + steps + ", or raise train.max_steps to at least " + warmup;
    conflict(path, set, "optim.warmup_steps", static_cast<double>(c.warmup_steps), "train.max_steps",
             static_cast<double>(c.max_steps), "must be in [0, train.max_steps]", fix);
  }
  require(c.final_lr_factor >= 0 && c.final_lr_factor <= 1, "optim.final_lr_factor", "must be in [0, 1]");
  resolve_recipe(c, choices, key);
  c.data_order = parse_data_order(choices.data_order, key("train.data_order"));
  if (choices.init) {
    c.init = parse_init_scheme(*choices.init, key("model.init"));
    require(c.init_from.empty(), "model.init", "applies to a model trained from scratch, not one from model.init_from");
  }
  // OLMo-core's order is its NumpyFSLDataLoader's over one dataset's files, Megatron's its GPTDataset's over one
  // indexed dataset; a mixture is the engine's own schedule.
  require(c.data_order == DataOrder::kArchspace || (c.sources.empty() && c.format == DataFormat::kTokens),
          "train.data_order",
          std::string("= \"") + data_order_name(c.data_order) +
              "\" applies to token data from data.train (not a [[data.sources]] mixture or chat data)");
  require(c.data_order != DataOrder::kMegatron || c.shuffle, "data.shuffle",
          "must be true under train.data_order = \"megatron\" (Megatron's GPTDataset always shuffles)");
  require(c.keep_last >= 1, "checkpoint.keep_last", "must be >= 1");
  require(c.downstream_format == "rc" || c.downstream_format == "mc", "eval.downstream_format",
          "must be rc or mc, not '" + c.downstream_format + "'");
  require(c.downstream_limit >= 0, "eval.downstream_limit", "must be >= 0 (0: every document)");
  require(!c.downstream_shots || *c.downstream_shots >= 0, "eval.downstream_shots", "must be >= 0");
  // Values that train to NaN, or run for ever, are refused before anything starts (nan fails every test).
  auto finite = [](double v) { return std::isfinite(v); };
  require(finite(c.lr) && c.lr <= 10, "optim.lr", "must be a finite number in (0, 10], got " + std::to_string(c.lr));
  require(c.beta1 >= 0 && c.beta1 < 1, "optim.beta1", "must be in [0, 1), got " + std::to_string(c.beta1));
  require(c.beta2 >= 0 && c.beta2 < 1, "optim.beta2", "must be in [0, 1), got " + std::to_string(c.beta2));
  require(finite(c.eps) && c.eps > 0, "optim.eps", "must be a finite number > 0, got " + std::to_string(c.eps));
  require(finite(c.weight_decay) && c.weight_decay >= 0, "optim.weight_decay", "must be a finite number >= 0");
  require(finite(c.clip_grad_norm) && c.clip_grad_norm >= 0, "optim.clip_grad_norm",
          "must be a finite number >= 0 (0: off)");
  require(finite(c.z_loss) && c.z_loss >= 0, "optim.z_loss", "must be a finite number >= 0");
  require(c.micro_batch <= (1 << 20) && c.grad_accum <= (1 << 20), "train.micro_batch",
          "and train.grad_accum must be at most 1048576 each");
  require(c.sequence_length <= (1 << 24), "train.sequence_length", "must be at most 16777216");
  const int sources = !c.preset.empty() + !c.model_config.empty();
  require(sources <= 1, "model.preset", "and model.config are exclusive");
  require(sources == 1 || !c.init_from.empty(), "model.preset", "(or model.config, or model.init_from) is required");
  require(c.token_dtype.empty() || c.token_dtype == "uint8" || c.token_dtype == "uint16" || c.token_dtype == "uint32" ||
              c.token_dtype == "uint64",
          "data.token_dtype", "must be \"uint8\", \"uint16\", \"uint32\" or \"uint64\"");
  // A Megatron prefix DIR/NAME names NAME.bin and NAME.idx, not a file of its own.
  auto exists = [](const std::string& p) { return fs::exists(p) || fs::exists(p + ".idx") || fs::exists(p + ".bin"); };
  if (c.sources.empty() && !exists(c.train_data))
    throw Error(key("data.train") + ": '" + c.train_data + "' does not exist");
  if (!c.valid_data.empty() && !exists(c.valid_data))
    throw Error(key("data.valid") + ": '" + c.valid_data + "' does not exist");
  validate_mixture(c, path, key, exists);
}

}  // namespace

TrainConfig TrainConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string file_text = read_text_file(path);
  toml::table root;
  try {
    root = toml::parse(file_text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    throw Error(path + ": malformed TOML at " + where.str() + ": " + std::string(e.description()));
  }
  for (const auto& o : overrides) apply_override(root, o, path);
  // The placeholder takes the variant after overrides; a bad variant is reported by validate().
  const toml::node* variant = root.at_path("model.variant").node();
  const bool substituted =
      substitute_variant(root, variant && variant->is_string() ? variant->as_string()->get() : "base");

  TrainConfig c;
  c.source = path;
  // Relative paths in the file are relative to the directory the command runs in (the repo root for
  // reproduce/...), which is what a user typing them expects.
  const ChoiceTexts choices = read_keys(root, c, path, nullptr);
  validate(c, choices, path, overridden_keys(overrides));
  if (overrides.empty() && !substituted) {
    c.text = file_text;
  } else {
    std::ostringstream os;
    os << "# " << path << " as run";
    for (const auto& o : overrides) os << " --set " << o;
    os << " ({variant} = " << variant_name(c.variant) << ")\n" << toml::toml_formatter(root) << "\n";
    c.text = os.str();
  }
  return c;
}

ModelConfig TrainConfig::model() const {
  ModelConfig m = !model_config.empty() ? ModelConfig::load(model_config) : archspace::preset(preset, variant);
  if (!model_config.empty() && m.variant != variant) {
    throw Error(source + ": key 'model.variant' is \"" + variant_name(variant) + "\" but " + model_config + " is " +
                variant_name(m.variant));
  }
  switches.apply_to(m, source +
                           ": keys 'model.use_siamese_norm', 'model.use_depth_attention', 'model.depth_attention_*', "
                           "'model.norm_topology', 'model.siamese_*'");
  if (rope_scaling) m.rope_scaling = rope_scaling;
  if (max_position_embeddings) m.max_position_embeddings = *max_position_embeddings;
  m.validate(source);
  return m;
}

}  // namespace archspace
