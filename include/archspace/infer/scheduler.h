// The decoding engine (continuous batching), shared by `generate`, `serve` and the generation tasks of `eval
// downstream`. Callers (HTTP threads, the evaluator, `generate`) submit requests, each a group of sequences
// (prompts x choices; infer/request.h); one thread owns the model: the engine's own, or the caller's
// (caller_drives). Each turn is vLLM's engine step:
// the policy (infer/schedule_policy.h) drops what was cancelled or expired and admits waiting sequences up to
// max_batch; the execution (infer/batch_executor.h) prefills them alone and joins their KV caches to the
// running batch's, the policy names the rows whose request ended, and the execution runs one decode step for
// the batch, streaming each row's new text to its request and letting finished rows leave. Rows sample
// independently (infer/sampler.h: own options and seeded generator), so a request's tokens do not depend on
// what else is running, up to the float rounding of batched matmuls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "archspace/infer/batch_executor.h"
#include "archspace/infer/decode_step.h"
#include "archspace/infer/generator.h"
#include "archspace/infer/request.h"
#include "archspace/infer/schedule_policy.h"
#include "archspace/infer/score.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

struct SchedulerOptions {
  int64_t max_batch = 8;    // sequences decoded together
  int64_t max_queue = 256;  // sequences (prompts x n of each request) waiting to start; beyond: 429
  int64_t prefill_chunk = 1024;
  // How decode steps run (infer/decode_step.h). Other than eager, a batch's shape is fixed at its first step (its
  // rows rounded up to a power of two, at most max_batch): a waiting sequence joins an idle row when its steps fit
  // the batch's slots, else it starts the next batch (docs/inference.md, "fixed-shapes").
  DecodeMode decode_steps = DecodeMode::kEager;
  // No engine thread: the caller submits its work, then runs the steps itself (drive), as vLLM's LLMEngine
  // serves offline `generate` where its AsyncLLMEngine serves HTTP. For a caller that waits anyway (`generate`,
  // `eval downstream`): the decode steps then run on the thread whose OpenMP pool already exists. A second pool
  // (the engine thread's) makes libgomp count more threads than cores and stop spinning between parallel
  // regions: the 190M's batch-1 decode ran ~12% slower on 2 cores (bench/compare_builds.py).
  bool caller_drives = false;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;                       // sequences
  int64_t completed_sequences = 0, generated_tokens = 0;  // of finished sequences
  // Since the start, every sequence counted as it goes (for throughput): prompt tokens prefilled, tokens sampled.
  int64_t prompt_tokens = 0, sampled_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;                          // time in prefills and in decode steps
  int64_t cache_bytes = 0, cache_sliding_bytes = 0, cache_full_bytes = 0;  // the batch's KV cache at its largest
  // Decode steps run, and their rows summed (a fixed-shape step computes a bucket of rows: infer/batch_executor.h).
  int64_t decode_steps = 0, rows_computed = 0;
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
  // caller_drives only: runs engine steps on this thread until every submitted request has finished, calling
  // `after_step` after each (to take the tickets' events: Ticket::poll_event).
  void drive(const std::function<void()>& after_step);
  // caller_drives only, for a caller with one request (generate, eval's generation tasks): drive() until it has
  // finished, handing each of `ticket`'s events to `on_event` as the steps make them. Returns the request's error
  // ("" when it completed; the failure a model error leaves in Ticket::error()).
  std::string drive(Ticket& ticket, const std::function<void(const Ticket::Event&)>& on_event);
  // caller_drives only: runs the engine loop on this thread (waiting for work when there is none) until stop()
  // was called and every submitted request has finished: `serve`'s main thread, while HTTP threads submit.
  void run();
  // Finishes every submitted request, then ends the loop thread (caller_drives: refuses later submissions; what
  // drive did not run stays unfinished).
  void stop();
  SchedulerStats stats() const;

 private:
  void loop();
  bool step();  // one engine step; false when stopped and nothing is left

  const CausalLM& model_;
  SchedulerOptions options_;
  BatchExecutor executor_;  // the engine thread's alone

  mutable std::mutex mutex_;  // guards policy_, stopping_, running_
  std::condition_variable wake_;
  SchedulePolicy policy_;
  bool stopping_ = false;
  int64_t running_ = 0;
  std::thread thread_;
};

}  // namespace archspace
