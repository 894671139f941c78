// The engine's one decode loop (continuous batching), shared by `serve` and by the generation tasks of `eval
// downstream`. Callers (HTTP threads, the evaluator) submit requests, each a group of sequences (prompts x
// choices); one scheduler thread owns the model. Each loop turn it admits waiting
// sequences up to max_batch (each prefilled alone, its KV cache then joining the running batch's), runs
// one decode step for the whole batch, streams each row's new text to its request, and lets finished rows
// leave the batch. Rows sample independently (own options and seeded generator), so a request's tokens do
// not depend on what else is running, up to the float rounding of batched matmuls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "archspace/infer/generator.h"
#include "archspace/infer/score.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

// One sequence to complete: a prompt, then up to max_tokens sampled tokens.
struct SequenceRequest {
  std::vector<uint32_t> prompt;
  int64_t max_tokens = 16;  // 0: nothing generated (scoring the prompt only)
  SamplingOptions sampling;
  std::vector<uint32_t> stop_ids;  // end the sequence (not part of the text)
  // End it; the text is cut before them. Shared: the sequences of one request hold one list (null: none).
  std::shared_ptr<const StopStrings> stop_strings;
  int64_t logprobs = -1;             // >= 0: log-probability of each generated token and the top n
  bool score_prompt = false;         // also the log-probability of each prompt token (echo + logprobs)
  bool skip_special_tokens = false;  // special tokens add no text (lm-eval's decode of a generation)
};

struct GeneratedToken {
  uint32_t id = 0;
  float logprob = 0;                            // filled when logprobs >= 0
  std::vector<std::pair<uint32_t, float>> top;  // the `logprobs` most likely, most likely first
};

struct SequenceResult {
  std::vector<TokenLogprob> prompt_logprobs;  // prompt[1..] (score_prompt only)
  std::vector<GeneratedToken> tokens;         // generated, without a stop id that ended it
  std::string text;                           // generated text, cut before a stop string
  std::string finish_reason;                  // "stop" (stop id or string) or "length"
};

// What a submitted request's HTTP thread waits on: per-sequence text pieces as they come, then results.
class Ticket {
 public:
  explicit Ticket(size_t sequences) : results_(sequences), finished_(sequences, false) {}

  struct Event {
    size_t index;        // which sequence
    std::string text;    // newly streamable text (may be empty on the final event)
    bool final = false;  // the sequence is finished: results() holds it
  };
  // Blocks until an event is available or everything is finished or the client check cancelled the request
  // (then nullopt); events of one sequence come in order.
  std::optional<Event> next_event();
  // Blocks until every sequence finished (or failed).
  void wait();
  // wait() for at most `timeout`; true when everything finished.
  bool wait_for(std::chrono::milliseconds timeout);
  const std::vector<SequenceResult>& results() const { return results_; }
  // Non-empty when the request failed in the model (the HTTP layer answers 500 with it).
  std::string error() const;
  // The client went away: its sequences leave the batch at the next step.
  void cancel() { cancelled_ = true; }
  // `gone()` tells whether the request's client has left; the scheduler asks it (on its thread, under the
  // ticket's lock) once per loop turn while the request waits or decodes, and cancels it on true. The
  // caller clears it (clear_client_check) before whatever it reads may stop being valid (a closed socket).
  void set_client_check(std::function<bool()> gone);
  void clear_client_check();
  bool cancelled() const { return cancelled_; }
  bool timed_out() const { return timed_out_; }  // failed for passing its deadline

 private:
  friend class Scheduler;
  void push_text(size_t index, std::string text);
  void finish(size_t index, SequenceResult result);
  void fail(const std::string& message);
  void expire();        // fail() for its deadline
  bool check_client();  // runs the client check; true when the request is (now) cancelled

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Event> events_;
  std::vector<SequenceResult> results_;
  std::vector<bool> finished_;
  size_t finished_count_ = 0;
  std::string error_;
  std::function<bool()> client_gone_;
  std::atomic<bool> cancelled_{false}, timed_out_{false};
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
};

struct SchedulerOptions {
  int64_t max_batch = 8;    // sequences decoded together
  int64_t max_queue = 256;  // sequences (prompts x n of each request) waiting to start; beyond: 429
  int64_t prefill_chunk = 1024;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;                       // sequences
  int64_t completed_sequences = 0, generated_tokens = 0;  // of finished sequences
  // Since the start, every sequence counted as it goes (for throughput): prompt tokens prefilled, tokens sampled.
  int64_t prompt_tokens = 0, sampled_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options);
  ~Scheduler();  // stops the loop (after the work it holds)

  // nullptr when the queue cannot take the request's sequences now (HTTP 429). Throws Error for sequences that
  // could never run: more than max_queue of them, an empty prompt, ids outside the vocabulary, prompt +
  // max_tokens past max_position_embeddings. Past `deadline`, the request fails (Ticket::timed_out()) and
  // its sequences leave at the next step.
  std::shared_ptr<Ticket> submit(
      std::vector<SequenceRequest> sequences,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  // Finishes every submitted request, then ends the loop thread.
  void stop();
  SchedulerStats stats() const;

 private:
  struct Waiting {
    std::shared_ptr<Ticket> ticket;
    std::vector<SequenceRequest> sequences;
    size_t next = 0;  // sequences admitted so far
  };
  struct Row;
  void loop();
  // Prefills one sequence alone and samples its first token; returns its row when it goes on decoding.
  std::unique_ptr<Row> admit(const std::shared_ptr<Ticket>& ticket, size_t index, SequenceRequest sequence,
                             KVCache& joining);
  // Takes the sampled token into the row; true when the row is finished.
  bool take_token(Row& row, const at::Tensor& logits, int64_t id);
  void finish(Row& row, const std::string& reason);

  const CausalLM& model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  SchedulerOptions options_;
  int64_t sampled_ids_;  // ids the tokenizer has (a vocabulary padded past it holds no tokens)

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Waiting> waiting_;
  int64_t waiting_sequences_ = 0;  // not yet admitted, over waiting_
  bool stopping_ = false;
  int64_t running_ = 0, completed_ = 0, generated_ = 0;
  std::atomic<int64_t> prompt_tokens_{0}, sampled_tokens_{0};
  std::thread thread_;
};

}  // namespace archspace
