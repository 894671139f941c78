// What a caller hands the decoding engine and gets back: sequences to complete, their results, and the ticket
// a caller waits on (streamed text, then results), apart from the engine's policy and execution.
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
#include <utility>
#include <vector>

#include "archspace/infer/completion_text.h"
#include "archspace/infer/sampler.h"
#include "archspace/infer/score.h"

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
  // Past `deadline`, the request fails (timed_out()) and its sequences leave at the engine's next step.
  explicit Ticket(size_t sequences,
                  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max())
      : results_(sequences), finished_(sequences, false), deadline_(deadline) {}

  struct Event {
    size_t index;        // which sequence
    std::string text;    // newly streamable text (may be empty on the final event)
    bool final = false;  // the sequence is finished: results() holds it
  };
  // Blocks until an event is available or everything is finished or the client check cancelled the request
  // (then nullopt); events of one sequence come in order.
  std::optional<Event> next_event();
  // The next event if one is waiting, else nullopt at once (for a caller that drives the engine itself).
  std::optional<Event> poll_event();
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
  // The engine's parts: the policy ends requests (expire, client check), the execution streams and finishes them.
  friend class SchedulePolicy;
  friend class BatchExecutor;
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
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace archspace
