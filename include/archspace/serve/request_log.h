// What `serve` logs on stderr, as uvicorn's access log and vLLM's stats logger do: one line per request
// (client, request line, status, prompt and completion tokens, latency), and every few seconds that saw
// traffic, the throughput (prompt and generation tokens/s) with the sequences running and waiting.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "archspace/infer/scheduler.h"

namespace archspace::serve {

struct AccessRecord {
  std::string client;  // "ip:port"
  std::string method, path, version;
  int status = 0;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: not a generation (or it failed)
  double latency_ms = 0;                               // from the request's first byte to the answer's last
  bool client_gone = false;                            // the client left before its answer was whole
};

// `archspace serve: 127.0.0.1:5000 "POST /v1/completions HTTP/1.1" 200 prompt_tokens=5 completion_tokens=16
// latency_ms=81`; "-" for counts a request has not.
std::string access_line(const AccessRecord& r);

// Notes of the request handled on this thread (httplib runs a connection's handler, its stream and the
// logger on one thread): its token counts, or that its client left. take_notes() returns and clears them.
void note_tokens(int64_t prompt, int64_t completion);
void note_client_gone();
AccessRecord take_notes();

// Writes one line to stderr in one write (lines of concurrent requests do not interleave).
void log_line(const std::string& line);

// Every `interval_s` seconds (0: never), the throughput line when anything ran or was decoded.
class ThroughputLog {
 public:
  ThroughputLog(std::function<SchedulerStats()> stats, int64_t interval_s);
  ~ThroughputLog();
  // "" when nothing happened between the two (no tokens, nothing running or waiting).
  static std::string line(const SchedulerStats& before, const SchedulerStats& now, double seconds);

 private:
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace archspace::serve
