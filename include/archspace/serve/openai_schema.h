// The OpenAI API's request and response bodies as the server speaks them: JSON parsed and checked into
// typed requests (every field a client may send is type-checked; one the engine cannot honour, such as
// logit_bias, or one it does not know, is refused with a 400 naming it rather than ignored), and the responses built in
// OpenAI's shapes, including the legacy completions `logprobs` object (tokens, token_logprobs, top_logprobs,
// text_offset) that lm-eval reads. Errors carry an HTTP status and OpenAI's error body.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/infer/scheduler.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace::serve {

// Bodies keep their keys in the order built (OpenAI's field order; top_logprobs most likely first), where
// nlohmann::json would sort them.
using Json = nlohmann::ordered_json;

// Answered as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string param;  // the offending field (empty: none)
  std::string code;
  Json body() const;
};

// Per request, beyond what OpenAI bounds (docs/inference.md, "Serving limits"); each breach a 400 naming the flag.
struct RequestLimits {
  int64_t max_prompt_tokens = 262144;  // summed over the request's prompts (each also within the context)
  int64_t max_stop_strings = 64;       // OpenAI allows 4
  int64_t max_stop_bytes = 256;        // each (matching costs O(new bytes x stops) per token, any length)
};

// What the schema needs to know about the served model.
struct ServedModel {
  std::string id;  // the name clients pass as "model"
  const ModelConfig& config;
  const Tokenizer& tokenizer;
  std::vector<uint32_t> completion_stop_ids;  // <|endoftext|> and eos_token_id
  std::vector<uint32_t> chat_stop_ids;        // also <|im_end|>
  RequestLimits limits;
};

// The body as JSON (400 naming the position when it is not).
Json parse_body(const std::string& body);

struct GenerationParams {
  int64_t max_tokens = 16;
  int64_t n = 1;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool ignore_eos = false;     // vLLM's: no stop ids end a sequence (stop strings still do)
};

struct CompletionRequest {
  std::vector<std::vector<uint32_t>> prompts;  // one per prompt, tokenized
  GenerationParams params;
  bool echo = false;
  int64_t logprobs = -1;  // -1: none
};

struct ChatRequest {
  std::vector<uint32_t> prompt;  // the conversation as a generation prompt (SPEC.md section 6)
  GenerationParams params;
};

CompletionRequest parse_completion_request(const Json& body, const ServedModel& model);
ChatRequest parse_chat_request(const Json& body, const ServedModel& model);

// The scheduler's sequences: prompts x n choices, choice i*n+j for prompt i (OpenAI's order).
std::vector<SequenceRequest> completion_sequences(const CompletionRequest& request, const ServedModel& model);
std::vector<SequenceRequest> chat_sequences(const ChatRequest& request, const ServedModel& model);

// Whole responses from the finished results.
Json completion_response(const CompletionRequest& request, const std::vector<SequenceResult>& results,
                         const ServedModel& model, const std::string& id, int64_t created);
Json chat_response(const ChatRequest& request, const std::vector<SequenceResult>& results, const ServedModel& model,
                   const std::string& id, int64_t created);
// {"prompt_tokens", "completion_tokens", "total_tokens"}; prompts counted once per choice.
Json usage(const std::vector<std::vector<uint32_t>>& prompts, int64_t n, const std::vector<SequenceResult>& results);

// The text a token id stands for, as clients see it (bytes of a partial UTF-8 character replaced).
std::string token_text(const Tokenizer& tokenizer, uint32_t id);

// /tokenize {"prompt": text, "add_special_tokens": bool} -> {"tokens", "count", "max_model_len"};
// /detokenize {"tokens": [ids]} -> {"prompt": text}; /tokenizer_info (what lm-eval's RemoteTokenizer reads).
Json tokenize_response(const Json& body, const ServedModel& model);
Json detokenize_response(const Json& body, const ServedModel& model);
Json tokenizer_info(const ServedModel& model);
Json models_response(const ServedModel& model, int64_t created);

}  // namespace archspace::serve
