// The HTTP side of `archspace serve` (cpp-httplib): OpenAI-compatible routes over the scheduler.
//   POST /v1/completions, /v1/chat/completions   (stream: server-sent events ending in "data: [DONE]")
//   GET  /v1/models, /health (no key needed; also running and waiting counts), /tokenizer_info
//   POST /tokenize, /detokenize                 (what lm-eval's RemoteTokenizer calls)
// Every error is an OpenAI error body. Logs to stderr (ServerOptions): per request, the client, method, path,
// status, prompt and completion tokens and latency; periodically, the sequences running and waiting and the
// prompt and generation tokens/s. With an API key, every route but /health wants
// "Authorization: Bearer KEY" (401 otherwise).
#pragma once

#include <memory>
#include <string>

#include "archspace/infer/scheduler.h"
#include "archspace/model/causal_lm.h"
#include "archspace/serve/openai_schema.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (bind() returns it)
  std::string api_key;
  std::string model_id;  // the "model" clients name
  // Per request (docs/inference.md, "Serving limits"): the request line and headers, their lines, the body as received.
  int64_t max_header_bytes = 64 << 10, max_header_lines = 128, max_body_bytes = 16 << 20;
  int64_t request_timeout_s = 600;  // from submission to the last token; then 504 (or an error event)
  RequestLimits request;            // prompt tokens, stop strings
  SchedulerOptions scheduler;
  // On stderr: one line per request (access_log), and every stats_interval_s seconds that saw traffic, the
  // throughput (0: never).
  bool access_log = true;
  int64_t stats_interval_s = 10;
};

class HttpServer {
 public:
  HttpServer(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, ServerOptions options);
  ~HttpServer();
  // Binds the listening socket; returns the port (throws naming host and port when it cannot).
  int bind();
  // Serves until stop(): then accepts nothing new, finishes the requests in flight and returns.
  void run();
  // Safe from another thread (the signal watcher).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace archspace::serve
