#include "archspace/serve/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "archspace/infer/prompts.h"
#include "archspace/serve/http_guard.h"
#include "archspace/serve/openai_schema.h"
#include "archspace/serve/request_log.h"
#include "archspace/util/error.h"
#include "archspace/util/error_message.h"

namespace archspace::serve {

using json = Json;

namespace {
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.body(), e.status); }

// The client left before its answer: nothing it reads; logged as 499 (nginx's "client closed request").
void client_left(httplib::Response& res) {
  note_client_gone();
  send_json(res, ApiError(499, "the client closed the connection before the answer").body(), 499);
}

// The access log's token counts from a usage object.
void note_usage(const json& u) {
  note_tokens(u.at("prompt_tokens").get<int64_t>(), u.at("completion_tokens").get<int64_t>());
}

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

// One streamed event of a request: its fixed fields in OpenAI's order, then `choices` (and `usage` on the last).
json stream_event(const std::string& id, const char* object, int64_t created, const std::string& model_id,
                  json choices) {
  return json{
      {"id", id}, {"object", object}, {"created", created}, {"model", model_id}, {"choices", std::move(choices)}};
}

SchedulerOptions caller_driven(SchedulerOptions o) {
  o.caller_drives = true;  // HttpServer::run drives the engine
  return o;
}
}  // namespace

struct HttpServer::Impl {
  Impl(const CausalLM& m, std::shared_ptr<const Tokenizer> t, ServerOptions o)
      : tokenizer(std::move(t)),
        options(std::move(o)),
        model{options.model_id,
              m.config(),
              *tokenizer,
              stop_token_ids(*tokenizer, m.config(), false),
              stop_token_ids(*tokenizer, m.config(), true),
              options.request},
        scheduler(m, tokenizer, caller_driven(options.scheduler)),
        server(HttpLimits{options.max_header_bytes, options.max_header_lines, options.max_body_bytes}) {
    // One handler thread per connection: enough for every sequence being decoded, every request queued,
    // and a few more so that a full queue is answered (429) rather than left waiting for a thread.
    const size_t threads =
        static_cast<size_t>(std::min<int64_t>(options.scheduler.max_batch + options.scheduler.max_queue, 512) + 8);
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_keep_alive_timeout(2);  // idle keep-alive connections do not delay a shutdown long
    server.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
    routes();
  }

  std::shared_ptr<const Tokenizer> tokenizer;
  ServerOptions options;
  ServedModel model;
  Scheduler scheduler;
  // /v1/models' "created": when this server began serving the model, so that the list is the same bytes on every
  // request (a client or cache comparing two answers; per-request time made two reads a second apart differ).
  const int64_t served_since = now_seconds();
  GuardedServer server;
  std::atomic<int64_t> next_id{1};

  std::string new_id(const char* prefix) { return prefix + std::to_string(next_id++); }

  std::shared_ptr<Ticket> submit(std::vector<SequenceRequest> sequences) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options.request_timeout_s);
    auto ticket = scheduler.submit(std::move(sequences), deadline);
    if (!ticket) {
      throw ApiError(429,
                     "The server is busy: the queue of " + std::to_string(options.scheduler.max_queue) +
                         " sequences (--max-queue) cannot take this request now; retry later",
                     "", "queue_full");
    }
    return ticket;
  }

  static ApiError failure(const Ticket& ticket) {
    if (ticket.timed_out()) return ApiError(504, ticket.error(), "", "timeout");
    return ApiError(500, "the model failed on this request: " + ticket.error());
  }

  // Waits for a whole (non-streamed) answer while the scheduler watches the connection (see
  // GuardedServer::client_check; HTTP/1.1 clients may get a "100 Continue" probe): a client that left
  // cancels its sequences, which leave at the next step, and gets nothing.
  static bool wait_for_client(const httplib::Request& req, Ticket& ticket) {
    ticket.set_client_check(GuardedServer::client_check(req.version == "HTTP/1.1"));
    struct Clear {  // the check reads this connection's socket: not past this handler
      Ticket& ticket;
      ~Clear() { ticket.clear_client_check(); }
    } clear{ticket};
    while (!ticket.wait_for(std::chrono::milliseconds(50))) {
      if (ticket.cancelled()) return false;
    }
    return true;
  }

  static void check_failed(const Ticket& ticket) {
    if (!ticket.error().empty()) throw failure(ticket);
  }

  // Server-sent events of one request: each choice's text as it comes, its finish reason, then usage
  // (when asked) and [DONE]. `chunk(index, text, finish_reason)` builds one event's JSON.
  // `counts()` is the usage object (for the access log), `final_usage` the last event when the client asked
  // for usage.
  template <typename Chunk>
  void stream(httplib::Response& res, std::shared_ptr<Ticket> ticket, Chunk chunk, std::function<json()> counts,
              std::function<json()> final_usage, std::function<void(httplib::DataSink&)> opening) {
    // A reset is seen by the scheduler even before a token is written (a stream queued behind others);
    // no probe, since this thread writes the stream.
    ticket->set_client_check(GuardedServer::client_check(false));
    res.set_chunked_content_provider(
        "text/event-stream",
        [ticket, chunk, counts, final_usage, opening](size_t, httplib::DataSink& sink) {
          auto gone = [&] {
            ticket->cancel();
            note_client_gone();
            return false;
          };
          if (opening) opening(sink);
          while (auto event = ticket->next_event()) {
            if (!event->text.empty() && !write_event(sink, dump(chunk(event->index, event->text, json(nullptr)))))
              return gone();
            if (event->final) {
              const std::string& reason = ticket->results()[event->index].finish_reason;
              if (!write_event(sink, dump(chunk(event->index, "", json(reason))))) return gone();
            }
          }
          if (ticket->cancelled() && ticket->error().empty()) return gone();  // the scheduler saw it leave
          if (!ticket->error().empty()) {
            write_event(sink, dump(failure(*ticket).body()));
          } else {
            note_usage(counts());
            if (final_usage) write_event(sink, dump(final_usage()));
          }
          write_event(sink, "[DONE]");
          sink.done();
          return true;
        },
        [ticket](bool success) {  // before the connection closes
          ticket->clear_client_check();
          if (!success) ticket->cancel();
        });
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    auto request = std::make_shared<CompletionRequest>(parse_completion_request(parse_body(req.body), model));
    auto ticket = submit(completion_sequences(*request, model));
    const std::string id = new_id("cmpl-");
    const int64_t created = now_seconds();
    if (!request->params.stream) {
      if (!wait_for_client(req, *ticket)) return client_left(res);
      check_failed(*ticket);
      const json body = completion_response(*request, ticket->results(), model, id, created);
      note_usage(body.at("usage"));
      send_json(res, body);
      return;
    }
    const std::string model_id = model.id;
    auto chunk = [id, created, model_id](size_t index, const std::string& text, json finish) {
      return stream_event(id, "text_completion", created, model_id,
                          {{{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}});
    };
    std::function<json()> final_usage;
    if (request->params.include_usage) {
      final_usage = [=] {
        json last = stream_event(id, "text_completion", created, model_id, json::array());
        last["usage"] = usage(request->prompts, request->params.n, ticket->results());
        return last;
      };
    }
    std::function<void(httplib::DataSink&)> opening;
    if (request->echo) {
      const Tokenizer& tok = *tokenizer;
      opening = [=, &tok](httplib::DataSink& sink) {
        for (size_t i = 0; i < request->prompts.size() * request->params.n; ++i)
          write_event(sink, dump(chunk(i, tok.decode(request->prompts[i / request->params.n]), json(nullptr))));
      };
    }
    auto counts = [=] { return usage(request->prompts, request->params.n, ticket->results()); };
    stream(res, ticket, chunk, counts, final_usage, opening);
  }

  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    auto request = std::make_shared<ChatRequest>(parse_chat_request(parse_body(req.body), model));
    auto ticket = submit(chat_sequences(*request, model));
    const std::string id = new_id("chatcmpl-");
    const int64_t created = now_seconds();
    if (!request->params.stream) {
      if (!wait_for_client(req, *ticket)) return client_left(res);
      check_failed(*ticket);
      const json body = chat_response(*request, ticket->results(), model, id, created);
      note_usage(body.at("usage"));
      send_json(res, body);
      return;
    }
    const std::string model_id = model.id;
    auto chunk = [id, created, model_id](size_t index, const std::string& text, json finish) {
      json delta = finish.is_null() ? json{{"content", text}} : json::object();
      return stream_event(id, "chat.completion.chunk", created, model_id,
                          {{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}});
    };
    std::function<json()> final_usage;
    if (request->params.include_usage) {
      final_usage = [=] {
        json last = stream_event(id, "chat.completion.chunk", created, model_id, json::array());
        last["usage"] = usage({request->prompt}, request->params.n, ticket->results());
        return last;
      };
    }
    const int64_t n = request->params.n;
    auto opening = [=](httplib::DataSink& sink) {  // the assistant role first, as OpenAI sends it
      for (int64_t i = 0; i < n; ++i) {
        write_event(sink, dump(stream_event(id, "chat.completion.chunk", created, model_id,
                                            {{{"index", i},
                                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                                              {"logprobs", nullptr},
                                              {"finish_reason", nullptr}}})));
      }
    };
    auto counts = [=] { return usage({request->prompt}, request->params.n, ticket->results()); };
    stream(res, ticket, chunk, counts, final_usage, opening);
  }

  // Wraps a handler: ApiError and bad input (Error, or a JSON value of a type the checks missed) answer
  // with OpenAI's error body, 400; anything else is the server's fault, 500, its message without a backtrace.
  template <typename F>
  httplib::Server::Handler guarded(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      try {
        (this->*f)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError(400, e.what()));
      } catch (const nlohmann::json::exception& e) {
        send_error(res, ApiError(400, std::string("invalid request: ") + e.what()));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, "internal error: " + error_message(e)));
      }
    };
  }

  void routes() {
    // After each answer is written (httplib calls it on the connection's thread, even when the write failed).
    server.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      AccessRecord r = take_notes();
      if (!options.access_log) return;
      r.client = req.remote_addr + ":" + std::to_string(req.remote_port);
      r.method = req.method;
      r.path = req.path;
      r.version = req.version;
      r.status = res.status;
      r.latency_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - GuardedServer::request_start())
              .count();
      log_line(access_line(r));
    });
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      take_notes();  // none left from an earlier request of this thread
      if (const std::string& why = GuardedServer::refusal(); !why.empty()) {  // malformed framing: 400, close
        send_error(res, ApiError(GuardedServer::refusal_status(), why));
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError(401,
                               req.has_header("Authorization") ? "Incorrect API key provided"
                                                               : "Missing API key: send 'Authorization: Bearer KEY'",
                               "", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;                                          // an error the route already answered
      if (const std::string& why = GuardedServer::refusal(); !why.empty()) {  // headers or body over a limit
        res.status = GuardedServer::refusal_status();
        res.set_header("Connection", "close");
        send_json(res, ApiError(res.status, why).body(), res.status);
        return;
      }
      const std::string message =
          res.status == 404 ? "no route " + req.method + " " + req.path : "HTTP " + std::to_string(res.status);
      send_json(res, ApiError(res.status, message).body(), res.status);
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = "internal error: " + error_message(e);
      } catch (...) {
      }
      send_error(res, ApiError(500, message));
    });
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const SchedulerStats s = scheduler.stats();
      send_json(res, {{"status", "ok"},
                      {"running", s.running},
                      {"waiting", s.waiting},
                      {"completed_sequences", s.completed_sequences},
                      {"generated_tokens", s.generated_tokens},
                      {"prompt_tokens", s.prompt_tokens},
                      {"sampled_tokens", s.sampled_tokens}});
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, models_response(model, served_since));
    });
    server.Get("/tokenizer_info",
               [this](const httplib::Request&, httplib::Response& res) { send_json(res, tokenizer_info(model)); });
    server.Post("/tokenize", guarded(&Impl::tokenize));
    server.Post("/detokenize", guarded(&Impl::detokenize));
    server.Post("/v1/completions", guarded(&Impl::completions));
    server.Post("/v1/chat/completions", guarded(&Impl::chat_completions));
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    send_json(res, tokenize_response(parse_body(req.body), model));
  }
  void detokenize(const httplib::Request& req, httplib::Response& res) {
    send_json(res, detokenize_response(parse_body(req.body), model));
  }
};

HttpServer::HttpServer(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(tokenizer), std::move(options))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  const int port =
      o.port == 0 ? impl_->server.bind_to_any_port(o.host) : (impl_->server.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) {
    throw Error("serve: cannot listen on " + o.host + ":" + std::to_string(o.port) +
                " (--host/--port: address in use or not local?)");
  }
  return port;
}

void HttpServer::run() {
  ThroughputLog throughput([this] { return impl_->scheduler.stats(); }, impl_->options.stats_interval_s);
  // The engine's steps run on this thread, the one that loaded the model (infer/scheduler.h caller_drives: one
  // OpenMP pool); the HTTP server listens on another and its handler threads submit.
  std::exception_ptr failed;
  std::thread http([this, &failed] {
    try {
      impl_->server.listen_after_bind();
    } catch (...) {
      failed = std::current_exception();
    }
    impl_->scheduler.stop();  // the handlers have returned: nothing more will be submitted
  });
  impl_->scheduler.run();
  http.join();
  if (failed) std::rethrow_exception(failed);
}

void HttpServer::stop() { impl_->server.stop(); }

}  // namespace archspace::serve
