// archspace generate: text from a prompt (streamed), or from a batch of prompts (one JSON line each).
#include <cstdio>
#include <iostream>

#include "archspace/infer/generator.h"
#include "archspace/infer/prompts.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt_tokens, messages, prompts_file, tokenizer, dtype = "fp32", device = "cpu", profile;
  std::string quantization = "none", decode_steps = "eager";
  std::vector<std::string> prompts, stops;
  bool chat = false, skip_checksums = false;
  GenerateOptions options;
};

// The prompts from whichever of --prompts-file, --prompt-tokens, --messages, --prompt was given.
Prompts gather_prompts(const GenerateArgs& a, const Tokenizer& tokenizer, int64_t vocab_size) {
  const bool chat = a.chat || !a.messages.empty();
  if (!a.prompts_file.empty()) {
    if (!a.prompts.empty() || !a.prompt_tokens.empty() || !a.messages.empty()) {
      throw Error(
          "--prompts-file: give the prompts in the file only (not also --prompt, --prompt-tokens or --messages)");
    }
    return read_prompts_file(a.prompts_file, tokenizer, chat, vocab_size);
  }
  Prompts p;
  p.chat = chat;
  if (!a.prompt_tokens.empty()) {
    if (!a.prompts.empty() || !a.messages.empty())
      throw Error("--prompt-tokens: give the prompt as ids only (not also --prompt or --messages)");
    std::vector<uint32_t> ids;
    for (int64_t id : parse_token_ids(a.prompt_tokens, vocab_size, "--prompt-tokens"))
      ids.push_back(static_cast<uint32_t>(id));
    p.ids.push_back(std::move(ids));
  } else if (!a.messages.empty()) {
    if (a.prompts.size() > 1) throw Error("--messages: takes at most one --prompt (the next user turn)");
    p.ids.push_back(
        chat_prompt(tokenizer, read_json_file(a.messages), a.prompts.empty() ? "" : a.prompts[0], a.messages));
  } else {
    if (a.prompts.empty()) throw Error("generate: give --prompt, --prompt-tokens, --messages or --prompts-file");
    for (const auto& text : a.prompts) {
      if (text.empty()) throw Error("--prompt: empty prompt");
      p.ids.push_back(chat ? chat_prompt(tokenizer, nullptr, text, "--prompt") : tokenizer.encode(text));
    }
  }
  return p;
}

void report(const GenerateResult& r, size_t batch) {
  std::fprintf(
      stderr,
      "[generate] batch %zu | prefill %lld tokens in %.3f s (%.1f tok/s) | decode %lld tokens in %.3f s (%.1f tok/s) | "
      "KV cache %.2f MB (sliding %.2f MB, full %.2f MB)\n",
      batch, (long long)r.prefill_tokens, r.prefill_seconds, r.prefill_tokens / std::max(r.prefill_seconds, 1e-9),
      (long long)r.decode_tokens, r.decode_seconds, r.decode_tokens / std::max(r.decode_seconds, 1e-9),
      r.cache_bytes / 1e6, r.cache_sliding_bytes / 1e6, r.cache_full_bytes / 1e6);
}

int run(GenerateArgs a) {
  a.options.stop_strings = a.stops;
  a.options.validate();  // before loading anything
  a.options.decode_steps = decode_mode_for(a.decode_steps, a.device);
  a.model = model_dir_to_use(a.model, a.skip_checksums);  // a run directory or checkpoint names its model
  const ModelConfig config = load_model_config(a.model);
  auto tokenizer = model_tokenizer(a.model, a.tokenizer, config.vocab_size);
  const Prompts prompts = gather_prompts(a, *tokenizer, config.vocab_size);
  CausalLM model =
      load_model(a.model, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device(),
                           false, parse_quantization(a.quantization, "--quantization")});
  a.options.stop_ids = stop_token_ids(*tokenizer, model.config(), prompts.chat);

  CommandProfile profile(a.profile);
  GenerateResult r;
  if (prompts.ids.size() == 1) {
    r = generate(model, *tokenizer, prompts.ids[0], a.options,
                 [](const std::string& text) { std::cout << text << std::flush; });
    std::cout << std::endl;
  } else {
    // A batch: interleaved streams would be unreadable, so one JSON line per prompt at the end.
    r = generate(model, *tokenizer, prompts.ids, a.options, [](size_t, const std::string&) {});
    for (size_t i = 0; i < prompts.ids.size(); ++i) {
      const Completion& done = r.completions[i];
      nlohmann::ordered_json line = {{"index", i},
                                     {"prompt_tokens", prompts.ids[i].size()},
                                     {"completion_tokens", done.ids.size()},
                                     {"text", done.text},
                                     {"tokens", done.ids}};
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    std::cout << std::flush;
  }
  profile.finish();
  report(r, prompts.ids.size());
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<GenerateArgs>();
  SamplingOptions& s = a->options.sampling;
  auto* app =
      parent.add_subcommand("generate", "Generate text from a prompt (streams; reports tokens/s and cache memory)");
  add_model_option(app, a->model, "model directory, or a checkpoint or finished run directory holding one");
  add_skip_checksums_option(app, a->skip_checksums);
  app->add_option("--prompt", a->prompts, "prompt text (with --chat: the user message); repeat it to decode a batch");
  app->add_option("--prompt-tokens", a->prompt_tokens, "prompt as token ids instead");
  app->add_flag("--chat", a->chat, "format as a chat (SPEC.md section 6) and answer as the assistant");
  app->add_option("--messages", a->messages,
                  "chat: a JSON file with the conversation so far (list of {role, content})");
  app->add_option("--prompts-file", a->prompts_file,
                  "a batch: JSON Lines, one prompt per line (a string, or {\"prompt\"|\"tokens\"|\"messages\": ...}); "
                  "prompts of different lengths decode together; prints one JSON line per prompt");
  app->add_option("--max-new-tokens", a->options.max_new_tokens, "tokens to generate at most")->capture_default_str();
  app->add_option("--temperature", s.temperature, "0: greedy")->capture_default_str();
  app->add_option("--top-k", s.top_k, "sample among the k most likely (0: off)")->capture_default_str();
  app->add_option("--top-p", s.top_p, "nucleus sampling mass (1: off)")->capture_default_str();
  app->add_option("--seed", s.seed, "sampling seed")->capture_default_str();
  app->add_option("--stop", a->stops, "stop when the text contains this string (repeatable)");
  app->add_option("--tokenizer", a->tokenizer, "tokenizer (default: the one the model directory carries)");
  add_decode_steps_option(app, a->decode_steps);
  add_dtype_option(app, a->dtype, "compute dtype");
  add_quantization_option(app, a->quantization);
  add_device_option(app, a->device);
  add_profile_option(app, a->profile);
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(90, add);
}  // namespace archspace::cli
