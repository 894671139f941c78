// archspace serve: an OpenAI-compatible HTTP server over one model (see serve/http_server.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/serve/http_server.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct ServeArgs {
  std::string model, tokenizer, model_name, dtype = "fp32", device = "cpu";
  std::string quantization = "none", decode_steps = "eager";
  bool log_stats = true, skip_checksums = false;
  serve::ServerOptions server;
};

// SIGINT/SIGTERM: the handler only writes the signal to a pipe; a watcher thread reads it and stops the
// server (which finishes the requests in flight). A second signal ends the process at once.
int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signals{0};

void on_signal(int sig) {
  if (g_signals.fetch_add(1) > 0) ::_exit(128 + sig);
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

// The id clients send by default: the run's name for a run directory, a checkpoint in its checkpoints/
// folder, or either's model/ folder (runs/demo, runs/demo/model, runs/demo/checkpoints/step-N -> "demo");
// otherwise the directory's own name.
std::string default_model_id(const std::string& given) {
  namespace fs = std::filesystem;
  fs::path p = fs::absolute(given).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  if (p.filename() == "model" && fs::exists(p / "config.json")) p = p.parent_path();
  if (p.parent_path().filename() == "checkpoints") p = p.parent_path().parent_path();
  return p.filename().string();
}

int run(ServeArgs a) {
  if (a.model.empty())
    throw Error("serve: which model? archspace serve MODEL (a run, checkpoint or model directory), or --model MODEL");
  if (a.model_name.empty()) a.model_name = default_model_id(a.model);
  a.server.scheduler.decode_steps = decode_mode_for(a.decode_steps, a.device);  // before loading anything
  a.model = model_dir_to_use(a.model, a.skip_checksums);
  const ModelConfig config = load_model_config(a.model);
  auto tokenizer = model_tokenizer(a.model, a.tokenizer, config.vocab_size);
  CausalLM model =
      load_model(a.model, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device(),
                           false, parse_quantization(a.quantization, "--quantization")});
  a.server.model_id = a.model_name;
  if (!a.log_stats) a.server.stats_interval_s = 0;

  serve::HttpServer server(model, tokenizer, a.server);
  const int port = server.bind();
  if (::pipe(g_signal_pipe) != 0) throw Error("serve: cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::thread watcher([&] {
    char sig = 0;
    if (::read(g_signal_pipe[0], &sig, 1) == 1 && sig != 0) {
      std::fprintf(stderr, "archspace serve: %s: no new connections; finishing the requests in flight\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      server.stop();
    }
  });
  std::printf("archspace serve: model '%s' (%s) on http://%s:%d (max batch %lld, max queue %lld)\n",
              a.model_name.c_str(), a.model.c_str(), a.server.host.c_str(), port,
              static_cast<long long>(a.server.scheduler.max_batch),
              static_cast<long long>(a.server.scheduler.max_queue));
  std::fflush(stdout);
  server.run();
  const char none = 0;  // wakes the watcher when the server ended without a signal
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &none, 1);
  watcher.join();
  std::fprintf(stderr, "archspace serve: stopped\n");
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<ServeArgs>();
  serve::ServerOptions& s = a->server;
  auto* app = parent.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server (completions, chat, tokenize; continuous batching) for lm-eval and clients");
  auto* positional =
      app->add_option("MODEL", a->model, "a finished run directory, a checkpoint, or a model directory (or --model)");
  app->add_option("--model", a->model, "the same as MODEL, as a flag")->excludes(positional);
  add_skip_checksums_option(app, a->skip_checksums);
  app->add_option("--host", s.host, "address to listen on (loopback by default; 0.0.0.0 for all)")
      ->capture_default_str();
  app->add_option("--port", s.port, "TCP port (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' (all routes but /health)");
  app->add_option("--served-model-name,--model-name", a->model_name,
                  "the model id clients send and responses carry (default: the run's name, else the directory's)");
  app->add_flag("!--no-access-log,!--disable-log-requests", s.access_log,
                "no line per request on stderr (client, request, status, tokens, latency)");
  app->add_flag("!--disable-log-stats", a->log_stats, "no periodic throughput line on stderr");
  app->add_option("--log-stats-interval-s,--log-stats-interval", s.stats_interval_s,
                  "seconds between throughput lines (printed only when there was traffic)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app->add_option("--max-batch", s.scheduler.max_batch, "sequences decoded together")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  add_decode_steps_option(app, a->decode_steps);
  app->add_option("--max-queue", s.scheduler.max_queue,
                  "sequences (prompts x n of each request) waiting to start; beyond, 429 (a request of more: 400)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app->add_option("--max-body-bytes", s.max_body_bytes,
                  "bytes of a request body as received, whatever its transfer encoding; beyond, 413")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 32));
  app->add_option("--max-header-bytes", s.max_header_bytes,
                  "bytes of the request line and headers together; beyond, 431")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1024}, int64_t{16} << 20));
  app->add_option("--max-header-lines", s.max_header_lines, "header lines of a request; beyond, 431")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{100000}));
  app->add_option("--request-timeout-s,--request-timeout", s.request_timeout_s,
                  "seconds from a request's arrival to its last token; then 504 (streams: an error event)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400 * 7}));
  app->add_option("--max-prompt-tokens", s.request.max_prompt_tokens, "prompt tokens of one request, summed")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app->add_option("--max-stop-strings", s.request.max_stop_strings, "stop strings of one request")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app->add_option("--max-stop-bytes", s.request.max_stop_bytes, "bytes of each stop string")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app->add_option("--tokenizer", a->tokenizer, "tokenizer (default: the one the model directory carries)");
  add_dtype_option(app, a->dtype, "compute dtype");
  add_quantization_option(app, a->quantization);
  add_device_option(app, a->device);
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(110, add);
}  // namespace archspace::cli
