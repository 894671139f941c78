// archspace: the command line. Each subcommand parses its flags and calls the library; no model logic here.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "archspace/data/tokenize.h"
#include "archspace/data/token_shards.h"
#include "archspace/eval/perplexity.h"
#include "archspace/infer/generator.h"
#include "archspace/export/export_hf.h"
#include "archspace/chat/chat.h"
#include "archspace/model/model_io.h"
#include "archspace/train/trainer.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/json_lines.h"

using namespace archspace;

namespace {

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  throw Error("--dtype: unknown dtype '" + s + "' (use fp32 or bf16)");
}

at::Device parse_device(const std::string& s) {
  if (s == "cpu") return at::kCPU;
  if (s.rfind("cuda", 0) == 0) {
    if (!at::hasCUDA()) throw Error("--device " + s + ": this machine has no CUDA device");
    return at::Device(s);
  }
  throw Error("--device: unknown device '" + s + "' (use cpu or cuda[:N])");
}

AttentionImpl parse_attention(const std::string& s) {
  if (s == "sdpa") return AttentionImpl::kSdpa;
  if (s == "reference") return AttentionImpl::kReference;
  throw Error("--attention: unknown implementation '" + s + "' (use sdpa or reference)");
}

std::vector<int64_t> parse_tokens(const std::string& text, int64_t vocab_size) {
  std::vector<int64_t> ids;
  std::string normalized = text;
  for (char& c : normalized)
    if (c == ',') c = ' ';
  std::istringstream in(normalized);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) throw Error("--tokens: '" + word + "' is not an integer token id");
    if (id < 0 || id >= vocab_size) {
      throw Error("--tokens: token id " + word + " is out of range [0, " + std::to_string(vocab_size) + ")");
    }
    ids.push_back(id);
  }
  if (ids.empty()) throw Error("--tokens: no token ids given");
  return ids;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof(buf), "%.1fM", n / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  return buf;
}

std::string describe_rope(const ModelConfig& c, LayerType type) {
  std::ostringstream s;
  Rope rope = rope_for(c, type);
  if (type == LayerType::kFull && c.rope_scaling) {
    YarnFrequencies y = yarn_inv_freq(c.head_dim, c.rope_theta, *c.rope_scaling);
    s << "yarn (theta " << c.rope_theta << ", factor " << c.rope_scaling->factor << ", original length "
      << c.rope_scaling->original_max_position_embeddings << ", beta_fast " << c.rope_scaling->beta_fast
      << ", beta_slow " << c.rope_scaling->beta_slow << ", ramp dims " << y.low << ".." << y.high
      << ", attention factor " << y.attention_factor << ")";
  } else {
    s << "plain (theta " << c.rope_theta << ")";
  }
  return s.str();
}

// Layer types as a compact pattern: "[S, S, S, F] x 4" when it repeats, else the full list.
std::string describe_layer_types(const std::vector<LayerType>& types) {
  auto letter = [](LayerType t) { return t == LayerType::kSliding ? "S" : "F"; };
  for (size_t period = 1; period <= types.size(); ++period) {
    if (types.size() % period) continue;
    bool repeats = true;
    for (size_t i = period; i < types.size() && repeats; ++i) repeats = types[i] == types[i % period];
    if (!repeats) continue;
    std::string s = "[";
    for (size_t i = 0; i < period; ++i) s += std::string(i ? ", " : "") + letter(types[i]);
    s += "]";
    if (types.size() / period > 1) s += " x " + std::to_string(types.size() / period);
    return s;
  }
  return "[]";
}

void print_config(const ModelConfig& c, const std::string& weights_dtype) {
  std::cout << "variant:            " << variant_name(c.variant) << " (model_type " << model_type_name(c.variant) << ")\n";
  if (c.variant == Variant::kSiameseDepth) {
    std::cout << "  siamese norm:     " << (c.use_siamese_norm ? "on (hybrid_pre)" : "off") << "\n"
              << "  depth attention:  "
              << (c.use_depth_attention ? "on (stride " + std::to_string(c.depth_attention_stride) + ", recent window " +
                                              std::to_string(c.depth_attention_recent_window) + ")"
                                        : std::string("off"))
              << "\n";
  }
  std::cout << "layers:             " << c.num_hidden_layers << "\n"
            << "hidden size:        " << c.hidden_size << "\n"
            << "MLP size:           " << c.intermediate_size << "\n"
            << "heads:              " << c.num_attention_heads << " query, " << c.num_key_value_heads << " kv ("
            << (c.num_key_value_heads == c.num_attention_heads ? "MHA" : "GQA, " + std::to_string(c.kv_groups()) + " per group")
            << "), head_dim " << c.head_dim << "\n"
            << "vocabulary:         " << c.vocab_size;
  if (c.padded_vocab_size && c.padded_vocab_size != c.vocab_size) std::cout << " (padded to " << c.padded_vocab_size << " in training)";
  std::cout << "\nlayer types:        " << describe_layer_types(c.layer_types) << "  (S = sliding window "
            << c.sliding_window << ", F = full)\n"
            << "RoPE, sliding:      " << describe_rope(c, LayerType::kSliding) << "\n"
            << "RoPE, full:         " << describe_rope(c, LayerType::kFull) << "\n"
            << "max positions:      " << c.max_position_embeddings << "\n"
            << "rms_norm_eps:       " << c.rms_norm_eps << "\n"
            << "parameters:         " << parameter_count(c) << " (" << human_count(parameter_count(c)) << ")\n"
            << "dtype:              " << weights_dtype << "\n";
}

int cmd_info(const std::string& model_dir, const std::string& preset_name) {
  if (!preset_name.empty()) {
    print_config(preset(preset_name), "(preset: no weights)");
    return 0;
  }
  ModelConfig config = load_model_config(model_dir);
  std::string dtype = "(no weights found)";
  try {
    TensorStore store = TensorStore::open_dir(model_dir);
    check_weights(config, store, model_dir);
    std::map<std::string, int64_t> counts;
    for (const auto& name : store.names()) counts[store.info(name).dtype]++;
    dtype.clear();
    for (const auto& [name, n] : counts) dtype += (dtype.empty() ? "" : ", ") + name + " (" + std::to_string(n) + " tensors)";
  } catch (const Error& e) {
    // A config without weights is still worth describing; broken weights are an error.
    if (std::string(e.what()).find("no model weights") == std::string::npos) throw;
  }
  print_config(config, dtype);
  return 0;
}

struct LogitsArgs {
  std::string model, tokens, out, dtype = "fp32", device = "cpu", attention = "sdpa";
  int repeat = 1;  // >1: run the forward again and report each run's time (for bench/)
};

int cmd_logits(const LogitsArgs& a) {
  const at::ScalarType dtype = parse_dtype(a.dtype);
  const at::Device device = parse_device(a.device);
  const AttentionImpl impl = parse_attention(a.attention);
  CausalLM model = load_model(a.model, {dtype, device});
  std::vector<int64_t> ids = parse_tokens(a.tokens, model.config().vocab_size);
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Tensor logits;
  std::vector<double> seconds;
  for (int run = 0; run < std::max(1, a.repeat); ++run) {
    c10::InferenceMode inference;  // no autograd bookkeeping
    auto start = std::chrono::steady_clock::now();
    logits = model.forward(input, {impl});
    if (device.is_cuda()) logits = logits.to(at::kCPU);  // waits for the device
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (a.repeat > 1) {
    std::cerr << "forward_seconds:";
    for (double s : seconds) std::cerr << " " << s;
    std::cerr << "\n";
  }
  save_safetensors(a.out, {{"logits", logits[0].to(at::kCPU, at::kFloat)}});
  std::cerr << "wrote logits [" << ids.size() << ", " << model.config().vocab_size << "] to " << a.out << "\n";
  return 0;
}

struct InitArgs {
  std::string preset_name, out, variant = "base", dtype = "fp32", config_path;
  uint64_t seed = 0;
  bool no_siamese_norm = false, no_depth_attention = false;
  int64_t depth_stride = 0, depth_recent_window = -1;
};

int cmd_init(const InitArgs& a) {
  ModelConfig config;
  if (!a.config_path.empty()) {
    config = ModelConfig::load(a.config_path);
  } else {
    Variant v = a.variant == "base" ? Variant::kBase
                : a.variant == "siamese_depth" ? Variant::kSiameseDepth
                : throw Error("--variant: unknown variant '" + a.variant + "' (use base or siamese_depth)");
    config = preset(a.preset_name, v);
  }
  if (a.no_siamese_norm || a.no_depth_attention || a.depth_stride > 0 || a.depth_recent_window >= 0) {
    if (config.variant != Variant::kSiameseDepth) throw Error("init: the Depth-Attention/SiameseNorm switches need --variant siamese_depth");
    if (a.no_siamese_norm) config.use_siamese_norm = false;
    if (a.no_depth_attention) config.use_depth_attention = false;
    if (a.depth_stride > 0) config.depth_attention_stride = a.depth_stride;
    if (a.depth_recent_window >= 0) config.depth_attention_recent_window = a.depth_recent_window;
  }
  CausalLM model = CausalLM::random_init(config, a.seed);
  save_model(model, a.out, parse_dtype(a.dtype));
  std::cerr << "wrote a randomly initialised " << variant_name(config.variant) << " model ("
            << human_count(parameter_count(config)) << " parameters, seed " << a.seed << ") to " << a.out << "\n";
  return 0;
}

struct EncodeArgs {
  std::string tokenizer = "dolma2", text, file, ids;
};

// Encode text (or decode ids) with a tokenizer: for inspecting what the model sees.
int cmd_encode(const EncodeArgs& a) {
  auto tok = Tokenizer::load(a.tokenizer);
  if (!a.ids.empty()) {
    std::vector<uint32_t> ids;
    for (int64_t id : parse_tokens(a.ids, tok->vocab_size())) ids.push_back(static_cast<uint32_t>(id));
    std::cout << tok->decode(ids);
    return 0;
  }
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream in(a.file, std::ios::binary);
    if (!in) throw Error(a.file + ": cannot open");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::vector<uint32_t> ids;
  try {
    ids = tok->encode(text);
  } catch (const Error& e) {
    throw Error((a.file.empty() ? std::string("--text") : a.file) + ": " + e.what());
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

struct GenerateArgs {
  std::string model, prompt_tokens, messages, prompts_file, tokenizer, dtype = "fp32", device = "cpu";
  std::vector<std::string> prompts;
  bool chat = false;
  std::vector<std::string> stops;
  GenerateOptions options;
};

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

// One user turn as a chat, or a conversation followed by an optional user turn.
std::vector<uint32_t> chat_prompt(const Tokenizer& tokenizer, nlohmann::json messages, const std::string& text, const std::string& where) {
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
  if (messages.is_null()) messages = nlohmann::json::array();
  if (!text.empty()) messages.push_back({{"role", "user"}, {"content", text}});
  return encode_chat_prompt(tokenizer, messages, where);
}

// --prompts-file: JSON Lines, one prompt per line: a string, or {"prompt": "..."}, {"tokens": [ids]} or
// {"messages": [...]} (a chat, whatever --chat says).
std::vector<std::vector<uint32_t>> read_prompts_file(const std::string& path, const Tokenizer& tokenizer, bool& chat, int64_t vocab_size) {
  const bool format_as_chat = chat;
  std::vector<std::vector<uint32_t>> prompts;
  for_each_json_line(path, [&](const nlohmann::json& value, const std::string& where) {
    const nlohmann::json j = value.is_string() ? nlohmann::json{{"prompt", value}} : value;
    if (!j.is_object()) throw Error(where + ": expected a string or an object with \"prompt\", \"tokens\" or \"messages\"");
    if (j.contains("tokens")) {
      if (!j["tokens"].is_array()) throw Error(where + ": \"tokens\" must be a list of ids");
      std::vector<uint32_t> ids;
      for (const auto& id : j["tokens"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          throw Error(where + ": token id " + id.dump() + " is out of range [0, " + std::to_string(vocab_size) + ")");
        }
        ids.push_back(id.get<uint32_t>());
      }
      prompts.push_back(std::move(ids));
    } else if (j.contains("messages")) {
      prompts.push_back(chat_prompt(tokenizer, j["messages"], "", where));
      chat = true;  // the assistant's turn ends at <|im_end|>
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      const std::string text = j["prompt"].get<std::string>();
      if (text.empty()) throw Error(where + ": empty prompt");
      prompts.push_back(format_as_chat ? chat_prompt(tokenizer, nullptr, text, where) : tokenizer.encode(text));
    } else {
      throw Error(where + ": expected a string or an object with \"prompt\", \"tokens\" or \"messages\"");
    }
  });
  if (prompts.empty()) throw Error(path + ": no prompts");
  return prompts;
}

int cmd_generate(GenerateArgs a) {
  namespace fs = std::filesystem;
  std::string tok_spec = a.tokenizer;
  if (tok_spec.empty()) {
    if (!fs::exists(fs::path(a.model) / "tokenizer.json")) {
      throw Error(a.model + ": the model directory has no tokenizer.json (export-hf adds one; or pass --tokenizer)");
    }
    tok_spec = a.model;
  }
  auto tokenizer = Tokenizer::load(tok_spec);
  CausalLM model = load_model(a.model, {parse_dtype(a.dtype), parse_device(a.device)});
  if (tokenizer->vocab_size() > model.config().vocab_size) {
    throw Error(tokenizer->path() + ": " + std::to_string(tokenizer->vocab_size()) + " ids, more than the model's vocab_size " +
                std::to_string(model.config().vocab_size));
  }
  bool chat = a.chat || !a.messages.empty();
  std::vector<std::vector<uint32_t>> prompts;
  if (!a.prompts_file.empty()) {
    if (!a.prompts.empty() || !a.prompt_tokens.empty() || !a.messages.empty()) {
      throw Error("--prompts-file: give the prompts in the file only (not also --prompt, --prompt-tokens or --messages)");
    }
    prompts = read_prompts_file(a.prompts_file, *tokenizer, chat, model.config().vocab_size);
  } else if (!a.prompt_tokens.empty()) {
    std::vector<uint32_t> prompt;
    for (int64_t id : parse_tokens(a.prompt_tokens, model.config().vocab_size)) prompt.push_back(static_cast<uint32_t>(id));
    prompts.push_back(std::move(prompt));
  } else if (!a.messages.empty()) {
    if (a.prompts.size() > 1) throw Error("--messages: takes at most one --prompt (the next user turn)");
    prompts.push_back(chat_prompt(*tokenizer, read_json_file(a.messages), a.prompts.empty() ? "" : a.prompts[0], a.messages));
  } else {
    if (a.prompts.empty()) throw Error("generate: give --prompt, --prompt-tokens, --messages or --prompts-file");
    for (const auto& text : a.prompts) {
      if (text.empty()) throw Error("--prompt: empty prompt");
      prompts.push_back(chat ? chat_prompt(*tokenizer, nullptr, text, "--prompt") : tokenizer->encode(text));
    }
  }
  if (chat) {
    if (auto end = tokenizer->token_to_id("<|im_end|>")) a.options.stop_ids.push_back(*end);
  }
  if (auto eos = tokenizer->token_to_id("<|endoftext|>")) a.options.stop_ids.push_back(*eos);
  if (model.config().eos_token_id) a.options.stop_ids.push_back(static_cast<uint32_t>(*model.config().eos_token_id));
  a.options.stop_strings = a.stops;

  GenerateResult r;
  if (prompts.size() == 1) {
    r = generate(model, *tokenizer, prompts[0], a.options, [](const std::string& text) { std::cout << text << std::flush; });
    std::cout << std::endl;
  } else {
    // A batch: interleaved streams would be unreadable, so one JSON line per prompt at the end.
    r = generate(model, *tokenizer, prompts, a.options, [](size_t, const std::string&) {});
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Completion& done = r.completions[i];
      nlohmann::ordered_json line = {{"index", i}, {"prompt_tokens", prompts[i].size()}, {"completion_tokens", done.ids.size()},
                             {"text", done.text}, {"tokens", done.ids}};
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    std::cout << std::flush;
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "[generate] batch %zu | prefill %lld tokens in %.3f s (%.1f tok/s) | decode %lld tokens in %.3f s (%.1f tok/s) | "
                "KV cache %.2f MB (sliding %.2f MB, full %.2f MB)\n",
                prompts.size(), (long long)r.prefill_tokens, r.prefill_seconds, r.prefill_tokens / std::max(r.prefill_seconds, 1e-9),
                (long long)r.decode_tokens, r.decode_seconds, r.decode_tokens / std::max(r.decode_seconds, 1e-9), r.cache_bytes / 1e6,
                r.cache_sliding_bytes / 1e6, r.cache_full_bytes / 1e6);
  std::cerr << line;
  return 0;
}

struct PplArgs {
  std::string model, data, tokenizer, out, dtype = "fp32", device = "cpu";
  int64_t max_tokens = 0;
  PerplexityOptions options;
};

int cmd_eval_ppl(const PplArgs& a) {
  namespace fs = std::filesystem;
  CausalLM model = load_model(a.model, {parse_dtype(a.dtype), parse_device(a.device)});
  std::vector<int64_t> tokens;
  std::string tokenizer_name;
  if (fs::exists(fs::path(a.data) / "manifest.json")) {
    auto shards = TokenShards::open(a.data);
    tokenizer_name = shards->manifest().tokenizer_name;
    for (size_t s = 0; s < shards->num_shards(); ++s) {
      std::vector<uint32_t> buf(shards->shard_tokens(s));
      shards->read(s, 0, buf.size(), buf.data());
      tokens.insert(tokens.end(), buf.begin(), buf.end());
    }
  } else {
    std::string spec = a.tokenizer;
    if (spec.empty()) {
      if (!fs::exists(fs::path(a.model) / "tokenizer.json")) throw Error(a.model + ": the model directory has no tokenizer.json (pass --tokenizer)");
      spec = a.model;
    }
    auto tok = Tokenizer::load(spec);
    tokenizer_name = tok->name();
    std::ifstream in(a.data, std::ios::binary);
    if (!in) throw Error(a.data + ": cannot open (give a text file or a token shard directory)");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      for (uint32_t id : tok->encode(text)) tokens.push_back(id);
    } catch (const Error& e) {
      throw Error(a.data + ": " + e.what());
    }
  }
  if (a.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > a.max_tokens) tokens.resize(a.max_tokens);
  const auto start = std::chrono::steady_clock::now();
  PerplexityResult r = perplexity(model, tokens, a.options, [&](int64_t done, int64_t total) {
    std::fprintf(stderr, "\r[eval ppl] %lld/%lld tokens (%.0f%%)", (long long)done, (long long)total, 100.0 * done / total);
    std::fflush(stderr);
  });
  std::fprintf(stderr, "\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json j = {{"model", a.model}, {"data", a.data}, {"tokenizer", tokenizer_name}, {"tokens", tokens.size()},
                      {"scored_tokens", r.scored_tokens}, {"nll_sum", r.nll_sum}, {"mean_nll", r.nll_sum / r.scored_tokens},
                      {"perplexity", r.perplexity()}, {"context", r.context}, {"stride", r.stride}, {"windows", r.windows},
                      {"method", "strided sliding windows: each window scores only tokens no earlier window scored; ppl = exp(total NLL / scored tokens)"},
                      {"seconds", seconds}};
  if (!a.out.empty()) {
    std::ofstream(a.out) << j.dump(2) << "\n";
  }
  std::cout << j.dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"archspace: train, evaluate, serve and export OLMo 3 and its SiameseNorm + Depth-Attention variant"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads for tensor ops (default: all cores)");

  std::string info_dir, info_preset;
  auto* info = app.add_subcommand("info", "Describe a model directory (or a preset): variant, sizes, RoPE, parameters");
  info->add_option("MODEL_DIR", info_dir, "Hugging Face model directory (config.json + safetensors)");
  info->add_option("--preset", info_preset, "Describe a built-in preset instead");

  LogitsArgs logits_args;
  auto* logits = app.add_subcommand("logits", "Run the forward on token ids and write fp32 logits [T, vocab] as tensor 'logits'");
  logits->add_option("--model", logits_args.model, "model directory")->required();
  logits->add_option("--tokens", logits_args.tokens, "token ids, space or comma separated, e.g. \"1 2 3\"")->required();
  logits->add_option("--out", logits_args.out, "output .safetensors file")->required();
  logits->add_option("--dtype", logits_args.dtype, "compute dtype: fp32 (default) or bf16");
  logits->add_option("--device", logits_args.device, "cpu (default) or cuda[:N]");
  logits->add_option("--attention", logits_args.attention, "sdpa (default, fused kernels) or reference (plain fp32 path)");
  logits->add_option("--repeat", logits_args.repeat, "run the forward N times and print each run's seconds (benchmarks)");

  InitArgs init_args;
  auto* init = app.add_subcommand("init", "Write a randomly initialised model directory (SPEC.md init) from a preset");
  auto* init_preset = init->add_option("--preset", init_args.preset_name, "preset name (tiny, small, 190M, 370M, 1B, 3B, 7B, 32B)");
  auto* init_config = init->add_option("--config", init_args.config_path, "or a config.json to instantiate");
  init_preset->excludes(init_config);
  init->add_option("--out", init_args.out, "output model directory")->required();
  init->add_option("--variant", init_args.variant, "base (default) or siamese_depth");
  init->add_option("--seed", init_args.seed, "random seed (default 0)");
  init->add_option("--dtype", init_args.dtype, "dtype of the saved weights: fp32 (default) or bf16");
  init->add_flag("--no-siamese-norm", init_args.no_siamese_norm, "siamese_depth ablation: SiameseNorm off");
  init->add_flag("--no-depth-attention", init_args.no_depth_attention, "siamese_depth ablation: Depth-Attention off");
  init->add_option("--depth-stride", init_args.depth_stride, "siamese_depth: depth_attention_stride (default 8)");
  init->add_option("--depth-recent-window", init_args.depth_recent_window, "siamese_depth: depth_attention_recent_window (default 0)");

  EncodeArgs encode_args;
  auto* encode = app.add_subcommand("encode", "Encode text to token ids (or --ids to decode) with a tokenizer");
  encode->add_option("--tokenizer", encode_args.tokenizer, "tokenizer.json, a directory holding one, or dolma2 (default)");
  auto* enc_text = encode->add_option("--text", encode_args.text, "text to encode");
  auto* enc_file = encode->add_option("--file", encode_args.file, "file to encode");
  auto* enc_ids = encode->add_option("--ids", encode_args.ids, "token ids to decode instead");
  enc_text->excludes(enc_file)->excludes(enc_ids);
  enc_file->excludes(enc_ids);

  TokenizeOptions tok_opts;
  std::string invalid_utf8 = "error";
  auto* tokenize = app.add_subcommand("tokenize", "Text/JSONL to token shards (uint32, EOS after each document) + manifest.json");
  tokenize->add_option("--tokenizer", tok_opts.tokenizer, "tokenizer.json, a directory holding one, or dolma2 (default)");
  tokenize->add_option("--out", tok_opts.out_dir, "output shard directory (must not hold shards yet)")->required();
  tokenize->add_option("INPUT", tok_opts.inputs, "text files (one document each), *.jsonl (one per line), or directories")->required();
  tokenize->add_option("--threads", tok_opts.threads, "encoding threads (default: all cores)");
  tokenize->add_option("--shard-tokens", tok_opts.shard_tokens, "tokens per shard file (default 268435456 = 1 GiB)");
  tokenize->add_option("--invalid-utf8", invalid_utf8, "error (default: stop, naming file and byte) or replace (U+FFFD, counted)");
  tokenize->add_option("--text-field", tok_opts.text_field, "JSONL field holding the text (default: text)");
  tokenize->add_flag("--verify-roundtrip", tok_opts.verify_roundtrip, "check decode(encode(doc)) == doc for every document");

  std::string train_config;
  TrainOptions train_opts;
  auto* train = app.add_subcommand("train", "Train one pipeline stage from a TOML run config");
  train->add_option("--config", train_config, "the run's TOML (see README, Training configuration)")->required();
  train->add_flag("--resume", train_opts.resume, "continue from the run's latest checkpoint");
  train->add_option("--stop-after", train_opts.stop_after_step, "stop after this step as if interrupted (for tests)");
  std::vector<std::string> train_overrides;
  train->add_option("--set", train_overrides, "override a key of the TOML: section.key=value (repeatable)");

  std::string export_src, export_out, export_dtype = "fp32";
  ExportOptions export_opts;
  auto* exporter = app.add_subcommand("export-hf", "Export a checkpoint as a Hugging Face model directory (+ tokenizer, + remote code)");
  exporter->add_option("CHECKPOINT", export_src, "a checkpoint, a finished run directory, or a model directory")->required();
  exporter->add_option("OUT_DIR", export_out, "new output directory")->required();
  exporter->add_option("--tokenizer", export_opts.tokenizer, "tokenizer to ship (default: the model's, else dolma2)");
  exporter->add_option("--dtype", export_dtype, "weights dtype: fp32 (default) or bf16");

  std::vector<std::string> plot_runs;
  std::string plot_out, plot_x = "step";
  auto* plot = app.add_subcommand("plot", "Draw the loss curves of several runs on one chart (PNG)");
  plot->add_option("RUN_DIR", plot_runs, "run directories (each with metrics.jsonl)")->required();
  plot->add_option("--out", plot_out, "output image, e.g. losses.png")->required();
  plot->add_option("--x", plot_x, "x axis: step (default) or tokens");

  GenerateArgs gen_args;
  auto* gen = app.add_subcommand("generate", "Generate text from a prompt (streams; reports tokens/s and cache memory)");
  gen->add_option("--model", gen_args.model, "model directory (with tokenizer.json, or pass --tokenizer)")->required();
  gen->add_option("--prompt", gen_args.prompts, "prompt text (with --chat: the user message); repeat it to decode a batch");
  gen->add_option("--prompt-tokens", gen_args.prompt_tokens, "prompt as token ids instead");
  gen->add_flag("--chat", gen_args.chat, "format as a chat (SPEC.md section 6) and answer as the assistant");
  gen->add_option("--messages", gen_args.messages, "chat: a JSON file with the conversation so far (list of {role, content})");
  gen->add_option("--prompts-file", gen_args.prompts_file,
                  "a batch: JSON Lines, one prompt per line (a string, or {\"prompt\"|\"tokens\"|\"messages\": ...}); "
                  "prompts of different lengths decode together; prints one JSON line per prompt");
  gen->add_option("--max-new-tokens", gen_args.options.max_new_tokens, "tokens to generate at most (128)");
  gen->add_option("--temperature", gen_args.options.sampling.temperature, "0 (default): greedy");
  gen->add_option("--top-k", gen_args.options.sampling.top_k, "sample among the k most likely (0: off)");
  gen->add_option("--top-p", gen_args.options.sampling.top_p, "nucleus sampling mass (1: off)");
  gen->add_option("--seed", gen_args.options.sampling.seed, "sampling seed (0)");
  gen->add_option("--stop", gen_args.stops, "stop when the text contains this string (repeatable)");
  gen->add_option("--tokenizer", gen_args.tokenizer, "tokenizer (default: the model directory's)");
  gen->add_option("--dtype", gen_args.dtype, "fp32 (default) or bf16");
  gen->add_option("--device", gen_args.device, "cpu (default) or cuda[:N]");

  PplArgs ppl_args;
  auto* eval = app.add_subcommand("eval", "Evaluate a model");
  auto* ppl = eval->add_subcommand("ppl", "Perplexity on token shards or a text file (JSON result)");
  eval->require_subcommand(1);
  ppl->add_option("--model", ppl_args.model, "model directory")->required();
  ppl->add_option("--data", ppl_args.data, "token shard directory, or a text file (tokenized with the model's tokenizer)")->required();
  ppl->add_option("--context", ppl_args.options.context, "window length (default min(max_position_embeddings, 4096))");
  ppl->add_option("--stride", ppl_args.options.stride, "window start spacing (default = context: disjoint windows)");
  ppl->add_option("--max-tokens", ppl_args.max_tokens, "evaluate only the first N tokens");
  ppl->add_option("--tokenizer", ppl_args.tokenizer, "tokenizer for text data (default: the model's)");
  ppl->add_option("--out", ppl_args.out, "also write the JSON result here");
  ppl->add_option("--dtype", ppl_args.dtype, "fp32 (default) or bf16");
  ppl->add_option("--device", ppl_args.device, "cpu (default) or cuda[:N]");

  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (*info) {
      if (info_dir.empty() == info_preset.empty()) throw Error("info: give a MODEL_DIR or --preset NAME");
      return cmd_info(info_dir, info_preset);
    }
    if (*logits) return cmd_logits(logits_args);
    if (*encode) return cmd_encode(encode_args);
    if (*gen) return cmd_generate(gen_args);
    if (*ppl) return cmd_eval_ppl(ppl_args);
    if (*plot) {
      // Plotting is matplotlib's job; hand the arguments to the project's script, unquoted by execvp.
      const char* python = std::getenv("ARCHSPACE_PYTHON") ? std::getenv("ARCHSPACE_PYTHON") : ARCHSPACE_PLOT_PYTHON;
      std::vector<std::string> args = {python, ARCHSPACE_PLOT_SCRIPT, "--out", plot_out, "--x", plot_x};
      args.insert(args.end(), plot_runs.begin(), plot_runs.end());
      std::vector<char*> argv_c;
      for (auto& a : args) argv_c.push_back(a.data());
      argv_c.push_back(nullptr);
      ::execvp(argv_c[0], argv_c.data());
      throw Error(std::string("plot: cannot run ") + python + " (run scripts/setup.sh)");
    }
    if (*exporter) {
      export_opts.dtype = parse_dtype(export_dtype);
      export_hf(export_src, export_out, export_opts);
      std::cerr << "exported " << export_src << " to " << export_out << "\n";
      return 0;
    }
    if (*train) {
      TrainResult r = run_training(TrainConfig::load(train_config, train_overrides), train_opts);
      std::cerr << "checkpoint: " << r.final_checkpoint << "\n";
      return 0;
    }
    if (*tokenize) {
      if (invalid_utf8 == "replace") tok_opts.invalid_utf8 = InvalidUtf8Policy::kReplace;
      else if (invalid_utf8 != "error") throw Error("--invalid-utf8: '" + invalid_utf8 + "' (use error or replace)");
      ShardManifest m = tokenize_to_shards(tok_opts);
      std::cerr << "wrote " << m.total_tokens() << " tokens of " << m.total_documents() << " documents in " << m.shards.size()
                << " shard(s) to " << tok_opts.out_dir << " (tokenizer " << m.tokenizer_name << ")\n";
      return 0;
    }
    if (*init) {
      if (init_args.preset_name.empty() && init_args.config_path.empty()) throw Error("init: give --preset NAME or --config FILE");
      return cmd_init(init_args);
    }
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "error (LibTorch): " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
