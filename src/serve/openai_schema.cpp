#include "archspace/serve/openai_schema.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "archspace/chat/chat.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"

namespace archspace::serve {

using json = Json;

namespace {
std::string error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 500:
      return "server_error";
    case 503:
      return "service_unavailable";
    default:
      return "invalid_request_error";
  }
}
}  // namespace

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string code_)
    : std::runtime_error(message),
      status(status_),
      type(error_type(status_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {
// nlohmann's messages quote the token read, which may be most of the body.
std::string clipped(std::string s, size_t most = 300) {
  if (s.size() > most) s = utf8_lossy(s.substr(0, most)) + "...";
  return s;
}
}  // namespace

json parse_body(const std::string& body) {
  try {
    check_json_depth(body, "the request body");
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, "the request body is not valid JSON: " + clipped(e.what()));
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double (1e400)
    throw ApiError(400, "the request body holds a number out of range: " + clipped(e.what()));
  }
}

namespace {

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

std::string kind_of(const json& v) { return v.type_name(); }

// Typed access to optional fields: absent or null gives nullopt; another type is a 400 naming the field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}
std::optional<bool> get_bool(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad(name, std::string("'") + name + "' must be a boolean, got " + kind_of(*v));
  return v->get<bool>();
}
std::optional<int64_t> get_int(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  // An unsigned beyond int64 would wrap (2^64-1 to -1, top_k "off"): out of range instead.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw bad(name, std::string("'") + name + "' is out of range (above 2^63-1), got " + v->dump());
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::abs(v->get<double>()) < 1e15)
    return static_cast<int64_t>(v->get<double>());
  throw bad(name, std::string("'") + name + "' must be an integer, got " + (v->is_number() ? v->dump() : kind_of(*v)));
}
std::optional<double> get_number(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad(name, std::string("'") + name + "' must be a number, got " + kind_of(*v));
  return v->get<double>();
}
std::optional<std::string> get_string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad(name, std::string("'") + name + "' must be a string, got " + kind_of(*v));
  return v->get<std::string>();
}

void check_object(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object, got " + kind_of(body));
}

void check_model(const json& body, const ServedModel& model) {
  if (auto name = get_string(body, "model"); name && *name != model.id) {
    throw ApiError(404, "The model '" + *name + "' does not exist; this server serves '" + model.id + "'", "model",
                   "model_not_found");
  }
}

// The fields each route reads (OpenAI's, and vLLM's extras: top_k, min_p, repetition_penalty, ignore_eos);
// any other is a 400 naming it, as OpenAI answers, rather than silently ignored.
const std::vector<std::string>& generation_fields() {
  static const std::vector<std::string> names = {"model",
                                                 "n",
                                                 "best_of",
                                                 "max_tokens",
                                                 "max_completion_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "min_p",
                                                 "seed",
                                                 "stop",
                                                 "stream",
                                                 "stream_options",
                                                 "frequency_penalty",
                                                 "presence_penalty",
                                                 "repetition_penalty",
                                                 "ignore_eos",
                                                 "logit_bias",
                                                 "user",
                                                 "logprobs"};
  return names;
}

void check_known_fields(const json& body, const std::vector<std::string>& common,
                        std::initializer_list<const char*> own) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(common.begin(), common.end(), key) != common.end()) continue;
    if (std::find_if(own.begin(), own.end(), [&](const char* n) { return key == n; }) != own.end()) continue;
    throw bad(key, "Unrecognized request argument supplied: '" + clipped(key, 100) + "'");
  }
}

// Fields the engine does not implement: accepted only at their neutral values.
void refuse_unsupported(const json& body) {
  if (const json* v = field(body, "logit_bias")) {
    if (!v->is_object()) throw bad("logit_bias", "'logit_bias' must be an object, got " + kind_of(*v));
    if (!v->empty()) throw bad("logit_bias", "'logit_bias' is not supported");
  }
  for (const char* name : {"tools", "functions", "tool_choice", "function_call", "response_format", "suffix"}) {
    const json* v = field(body, name);
    if (v && !(v->is_string() && v->get<std::string>().empty()))
      throw bad(name, std::string("'") + name + "' is not supported");
  }
  get_string(body, "user");  // accepted, type-checked, unused
}

std::string number_text(double v) {
  if (std::floor(v) == v && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return json(v).dump();
}

// A number field within [lo, hi] (bounds named in the message).
double number_in(const json& body, const char* name, double fallback, double lo, double hi, bool lo_open = false) {
  const double v = get_number(body, name).value_or(fallback);
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    throw bad(name, std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") + number_text(lo) + ", " +
                        number_text(hi) + "], got " + json(v).dump());
  }
  return v;
}

GenerationParams parse_params(const json& body, int64_t default_max_tokens, bool zero_tokens_allowed,
                              const RequestLimits& limits) {
  GenerationParams p;
  SamplingOptions& s = p.sampling;
  s.temperature = get_number(body, "temperature").value_or(1.0);
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.temperature > 2)
    throw bad("temperature", "'temperature' must be in [0, 2] (0: greedy), got " + json(s.temperature).dump());
  s.top_p = get_number(body, "top_p").value_or(1.0);
  if (!(s.top_p > 0 && s.top_p <= 1)) throw bad("top_p", "'top_p' must be in (0, 1], got " + json(s.top_p).dump());
  const int64_t top_k = get_int(body, "top_k").value_or(0);
  if (top_k < -1) throw bad("top_k", "'top_k' must be >= -1 (-1 or 0: off), got " + std::to_string(top_k));
  s.top_k = std::max<int64_t>(top_k, 0);
  s.min_p = number_in(body, "min_p", 0.0, 0.0, 1.0);
  s.repetition_penalty = number_in(body, "repetition_penalty", 1.0, 0.0, 10.0, /*lo_open=*/true);
  s.presence_penalty = number_in(body, "presence_penalty", 0.0, -2.0, 2.0);
  s.frequency_penalty = number_in(body, "frequency_penalty", 0.0, -2.0, 2.0);
  p.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  if (auto seed = get_int(body, "seed")) {
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    s.seed = std::random_device{}();
  }
  p.n = get_int(body, "n").value_or(1);
  if (p.n < 1 || p.n > 16) throw bad("n", "'n' must be in [1, 16], got " + std::to_string(p.n));
  if (auto best_of = get_int(body, "best_of"); best_of && *best_of != p.n)
    throw bad("best_of", "'best_of' is not supported (only equal to n)");
  const char* max_name =
      body.contains("max_completion_tokens") && !body.contains("max_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = get_int(body, max_name).value_or(default_max_tokens);
  const int64_t least = zero_tokens_allowed ? 0 : 1;
  if (p.max_tokens < least)
    throw bad(max_name, std::string("'") + max_name + "' must be at least " + std::to_string(least) + ", got " +
                            std::to_string(p.max_tokens));
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (static_cast<int64_t>(stop->size()) > limits.max_stop_strings) {
        throw bad("stop", "'stop' holds " + std::to_string(stop->size()) + " strings, more than " +
                              std::to_string(limits.max_stop_strings) + " (--max-stop-strings)");
      }
      for (const json& s : *stop) {
        if (!s.is_string())
          throw bad("stop", "'stop' must be a string or a list of strings, got a list holding " + kind_of(s));
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad("stop", "'stop' must be a string or a list of strings, got " + kind_of(*stop));
    }
    for (const auto& s : p.stop) {
      if (s.empty()) throw bad("stop", "'stop' holds an empty string (it would stop before the first token)");
      if (static_cast<int64_t>(s.size()) > limits.max_stop_bytes) {
        throw bad("stop", "'stop' holds a string of " + std::to_string(s.size()) + " bytes, more than " +
                              std::to_string(limits.max_stop_bytes) + " (--max-stop-bytes)");
      }
      if (find_invalid_utf8(s)) throw bad("stop", "'stop' holds invalid UTF-8");
    }
  }
  p.stream = get_bool(body, "stream").value_or(false);
  if (const json* o = field(body, "stream_options")) {
    if (!o->is_object()) throw bad("stream_options", "'stream_options' must be an object, got " + kind_of(*o));
    p.include_usage = get_bool(*o, "include_usage").value_or(false);
  }
  return p;
}

void check_length(const std::vector<uint32_t>& prompt, int64_t max_tokens, const ServedModel& model,
                  const std::string& what) {
  const int64_t limit = model.config.max_position_embeddings, n = static_cast<int64_t>(prompt.size());
  if (n == 0) throw bad(what, "'" + what + "' is empty (no tokens)");
  if (n > limit || max_tokens > limit - n) {  // n + max_tokens may overflow
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(limit) +
                       " tokens (max_position_embeddings); the request asks for " + std::to_string(n) + " in the " +
                       what + " and " + std::to_string(max_tokens) + " in max_tokens",
                   what, "context_length_exceeded");
  }
}

std::vector<uint32_t> encode_text(const std::string& text, const ServedModel& model, const std::string& param) {
  if (find_invalid_utf8(text)) throw bad(param, "'" + param + "' is not valid UTF-8");
  return model.tokenizer.encode(text);
}

std::vector<uint32_t> ids_of(const json& list, const ServedModel& model, const std::string& param) {
  std::vector<uint32_t> ids;
  for (const json& v : list) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw bad(param, "'" + param + "' token ids must be non-negative integers, got " +
                           (v.is_number() ? v.dump() : kind_of(v)));
    const int64_t id = v.get<int64_t>();
    if (id >= model.config.vocab_size)
      throw bad(param, "'" + param + "' holds token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                           std::to_string(model.config.vocab_size) + ")");
    ids.push_back(static_cast<uint32_t>(id));
  }
  return ids;
}

SequenceRequest base_sequence(const GenerationParams& p, const std::vector<uint32_t>& prompt, size_t choice,
                              const std::shared_ptr<const StopStrings>& stops) {
  SequenceRequest s;
  s.prompt = prompt;
  s.max_tokens = p.max_tokens;
  s.sampling = p.sampling;
  s.sampling.seed = p.sampling.seed + choice;  // the n choices of one prompt differ
  s.stop_strings = stops;                      // one list for the whole request
  return s;
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, const ServedModel& model) {
  check_object(body);
  check_known_fields(body, generation_fields(), {"prompt", "echo", "suffix"});
  check_model(body, model);
  refuse_unsupported(body);
  CompletionRequest r;
  const json* prompt = field(body, "prompt");
  if (!prompt) throw bad("prompt", "'prompt' is required");
  // A string, a list of ids, a list of strings, or a list of lists of ids.
  if (prompt->is_string()) {
    r.prompts.push_back(encode_text(prompt->get<std::string>(), model, "prompt"));
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    r.prompts.push_back(ids_of(*prompt, model, "prompt"));
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const json& p : *prompt) {
      if (p.is_string()) {
        r.prompts.push_back(encode_text(p.get<std::string>(), model, "prompt"));
      } else if (p.is_array()) {
        r.prompts.push_back(ids_of(p, model, "prompt"));
      } else {
        throw bad("prompt", "'prompt' must be a string, a list of token ids, or a list of either; got a list holding " +
                                kind_of(p));
      }
    }
  } else {
    throw bad("prompt", "'prompt' must be a non-empty string, list of token ids, or list of either; got " +
                            (prompt->is_array() ? std::string("an empty list") : kind_of(*prompt)));
  }
  r.params = parse_params(body, 16, /*zero_tokens_allowed=*/true, model.limits);
  r.echo = get_bool(body, "echo").value_or(false);
  if (auto logprobs = get_int(body, "logprobs")) {
    if (*logprobs < 0 || *logprobs > 20)
      throw bad("logprobs", "'logprobs' must be in [0, 20], got " + std::to_string(*logprobs));
    r.logprobs = *logprobs;
  }
  if (r.params.max_tokens == 0 && !r.echo)
    throw bad("max_tokens", "'max_tokens' 0 returns nothing without 'echo' (use echo with logprobs to score a prompt)");
  if (r.params.stream && r.logprobs >= 0)
    throw bad("logprobs", "'logprobs' is not supported with 'stream' (ask without streaming)");
  int64_t prompt_tokens = 0;
  for (const auto& p : r.prompts) {
    check_length(p, r.params.max_tokens, model, "prompt");
    prompt_tokens += static_cast<int64_t>(p.size());  // each within the context: no overflow
  }
  if (prompt_tokens > model.limits.max_prompt_tokens) {
    throw bad("prompt", "the request's prompts hold " + std::to_string(prompt_tokens) + " tokens, more than " +
                            std::to_string(model.limits.max_prompt_tokens) + " (--max-prompt-tokens)");
  }
  return r;
}

ChatRequest parse_chat_request(const json& body, const ServedModel& model) {
  check_object(body);
  check_known_fields(body, generation_fields(),
                     {"messages", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
                      "response_format", "parallel_tool_calls"});
  check_model(body, model);
  refuse_unsupported(body);
  if (get_bool(body, "logprobs").value_or(false)) throw bad("logprobs", "'logprobs' is not supported for chat");
  if (auto top = get_int(body, "top_logprobs")) {
    if (*top < 0 || *top > 20)
      throw bad("top_logprobs", "'top_logprobs' must be in [0, 20], got " + std::to_string(*top));
    if (*top > 0) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs', which is not supported for chat");
  }
  get_bool(body, "parallel_tool_calls");
  const json* messages = field(body, "messages");
  if (!messages) throw bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty())
    throw bad("messages", "'messages' must be a non-empty list of {role, content}");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad("messages", "'" + where + "' must be an object, got " + kind_of(m));
    if (!m.contains("content") || !m["content"].is_string())
      throw bad("messages", "'" + where + ".content' must be a string");
    if (find_invalid_utf8(m["content"].get<std::string>()))
      throw bad("messages", "'" + where + ".content' is not valid UTF-8");
  }
  ChatRequest r;
  try {
    r.prompt = encode_chat_prompt(model.tokenizer, *messages, "messages");
  } catch (const Error& e) {
    throw bad("messages", e.what());
  }
  const int64_t rest = model.config.max_position_embeddings - static_cast<int64_t>(r.prompt.size());
  r.params = parse_params(body, std::max<int64_t>(rest, 1), /*zero_tokens_allowed=*/false, model.limits);
  check_length(r.prompt, r.params.max_tokens, model, "messages");
  return r;
}

std::vector<SequenceRequest> completion_sequences(const CompletionRequest& r, const ServedModel& model) {
  std::vector<SequenceRequest> out;
  const auto stops = std::make_shared<const StopStrings>(r.params.stop);
  for (const auto& prompt : r.prompts) {
    for (int64_t j = 0; j < r.params.n; ++j) {
      SequenceRequest s = base_sequence(r.params, prompt, j, stops);
      if (!r.params.ignore_eos) s.stop_ids = model.completion_stop_ids;
      s.logprobs = r.logprobs;
      s.score_prompt = r.echo && r.logprobs >= 0;
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::vector<SequenceRequest> chat_sequences(const ChatRequest& r, const ServedModel& model) {
  std::vector<SequenceRequest> out;
  const auto stops = std::make_shared<const StopStrings>(r.params.stop);
  for (int64_t j = 0; j < r.params.n; ++j) {
    SequenceRequest s = base_sequence(r.params, r.prompt, j, stops);
    if (!r.params.ignore_eos) s.stop_ids = model.chat_stop_ids;
    out.push_back(std::move(s));
  }
  return out;
}

std::string token_text(const Tokenizer& tokenizer, uint32_t id) { return utf8_lossy(tokenizer.id_to_token(id)); }

json usage(const std::vector<std::vector<uint32_t>>& prompts, int64_t n, const std::vector<SequenceResult>& results) {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size()) * n;
  for (const auto& r : results) completion_tokens += static_cast<int64_t>(r.tokens.size());
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {
// OpenAI's legacy completions logprobs: one entry per token of the choice's text (prompt tokens first
// with echo; the first prompt token has no log-probability), text_offset the byte offset of each token's
// text in the choice's text.
json logprobs_object(const std::vector<uint32_t>& prompt, bool echo, const SequenceResult& result,
                     const Tokenizer& tok) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  int64_t offset = 0;
  auto top_of = [&](const std::vector<std::pair<uint32_t, float>>& top) {
    json o = json::object();
    for (const auto& [id, lp] : top) {
      const std::string text = token_text(tok, id);
      if (!o.contains(text)) o[text] = lp;  // tokens of the same text (partial characters): the likelier
    }
    return o;
  };
  auto add = [&](uint32_t id, json logprob, json top) {
    const std::string text = token_text(tok, id);
    tokens.push_back(text);
    token_logprobs.push_back(std::move(logprob));
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  };
  if (echo) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (i == 0 || result.prompt_logprobs.empty()) {
        add(prompt[i], nullptr, nullptr);
      } else {
        const TokenLogprob& t = result.prompt_logprobs[i - 1];
        add(prompt[i], t.logprob, top_of(t.top));
      }
    }
  }
  for (const GeneratedToken& t : result.tokens) add(t.id, t.logprob, top_of(t.top));
  return {
      {"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}
}  // namespace

json completion_response(const CompletionRequest& r, const std::vector<SequenceResult>& results,
                         const ServedModel& model, const std::string& id, int64_t created) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& prompt = r.prompts[i / r.params.n];
    const SequenceResult& res = results[i];
    json choice = {{"index", i},
                   {"text", (r.echo ? model.tokenizer.decode(prompt) : std::string()) + res.text},
                   {"logprobs", nullptr},
                   {"finish_reason", res.finish_reason}};
    if (r.logprobs >= 0) choice["logprobs"] = logprobs_object(prompt, r.echo, res, model.tokenizer);
    choices.push_back(std::move(choice));
  }
  return {{"id", id},          {"object", "text_completion"}, {"created", created},
          {"model", model.id}, {"choices", choices},          {"usage", usage(r.prompts, r.params.n, results)}};
}

json chat_response(const ChatRequest& r, const std::vector<SequenceResult>& results, const ServedModel& model,
                   const std::string& id, int64_t created) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    choices.push_back({{"index", i},
                       {"message", {{"role", "assistant"}, {"content", results[i].text}}},
                       {"logprobs", nullptr},
                       {"finish_reason", results[i].finish_reason}});
  }
  return {{"id", id},          {"object", "chat.completion"}, {"created", created},
          {"model", model.id}, {"choices", choices},          {"usage", usage({r.prompt}, r.params.n, results)}};
}

json tokenize_response(const json& body, const ServedModel& model) {
  check_object(body);
  check_known_fields(body, {"model"}, {"prompt", "messages", "add_special_tokens"});
  check_model(body, model);
  std::vector<uint32_t> ids;
  if (const json* messages = field(body, "messages")) {
    try {
      ids = encode_chat_prompt(model.tokenizer, *messages, "messages");
    } catch (const Error& e) {
      throw bad("messages", e.what());
    }
  } else {
    auto prompt = get_string(body, "prompt");
    if (!prompt) throw bad("prompt", "'prompt' is required (a string)");
    // The engine's tokenizers add no special tokens on their own (dolma2 has no BOS), so
    // add_special_tokens changes nothing; it is still type-checked.
    get_bool(body, "add_special_tokens");
    ids = encode_text(*prompt, model, "prompt");
  }
  return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.config.max_position_embeddings}};
}

json detokenize_response(const json& body, const ServedModel& model) {
  check_object(body);
  check_known_fields(body, {"model"}, {"tokens"});
  check_model(body, model);
  const json* tokens = field(body, "tokens");
  if (!tokens || !tokens->is_array()) throw bad("tokens", "'tokens' is required (a list of token ids)");
  return {{"prompt", model.tokenizer.decode(ids_of(*tokens, model, "tokens"))}};
}

json tokenizer_info(const ServedModel& model) {
  const Tokenizer& t = model.tokenizer;
  auto name = [&](std::optional<int64_t> id) -> json {
    if (!id || *id < 0 || *id >= t.vocab_size()) return nullptr;
    return token_text(t, static_cast<uint32_t>(*id));
  };
  // The end-of-text token the engine stops on; lm-eval encodes it back to find its id.
  json eos = t.token_to_id("<|endoftext|>") ? json("<|endoftext|>") : name(model.config.eos_token_id);
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"name", t.name()},
          {"eos_token", eos},
          {"bos_token", name(model.config.bos_token_id)},
          {"pad_token", name(model.config.pad_token_id)},
          {"vocab_size", t.vocab_size()},
          {"model_max_length", model.config.max_position_embeddings}};
}

json models_response(const ServedModel& model, int64_t created) {
  return {{"object", "list"},
          {"data",
           {{{"id", model.id},
             {"object", "model"},
             {"created", created},
             {"owned_by", "archspace"},
             {"max_model_len", model.config.max_position_embeddings}}}}};
}

}  // namespace archspace::serve
