// The decoding engine's execution (vLLM's execute_model + update_from_output): the rows it is given, their
// KV cache, and one step at a time. A joining sequence is prefilled alone and samples its first token; its
// cache then joins the batch's. A step is one batched forward of every row's pending token, each row's sample
// (infer/sampler.h: its own seeded generator), and the update from it: text streamed to the row's request,
// finished rows leaving. What joins and what leaves is the policy's decision (infer/schedule_policy.h).
//
// Decode steps run eagerly (the cache's rows join and leave as they come), or with fixed shapes, optionally
// replayed as a CUDA graph (infer/decode_step.h): then the batch's shape is fixed at its first step, its rows rounded
// up to a power of two (at most max_rows, and never below the rows it starts with) so that sequences can join; a row
// that leaves goes idle (KVCache::leave_row: fed the padding id, its outputs ignored) and a joining sequence takes
// the lowest idle row (KVCache::place_row) when its steps fit the slots the shapes were fixed for, or else waits for
// the next batch. Each step computes the rows up to the highest in use, in a bucket of 1, 2, 4, ... rows
// (decode_rows_bucket), after moving rows down into idle ones where that makes the bucket smaller (KVCache::move_row).
// room() says how many rows may join now.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "archspace/infer/decode_step.h"
#include "archspace/infer/schedule_policy.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

// What the execution has done since it started (read from any thread).
struct ExecutorCounters {
  std::atomic<int64_t> completed_sequences{0}, generated_tokens{0};  // finished sequences and their tokens
  std::atomic<int64_t> prompt_tokens{0}, sampled_tokens{0};          // every sequence, as it goes
  std::atomic<double> prefill_seconds{0}, decode_seconds{0};         // time in prefills, in decode steps
  std::atomic<int64_t> peak_cache_bytes{0}, peak_sliding_bytes{0}, peak_full_bytes{0};  // the batch's cache
  std::atomic<int64_t> decode_steps{0}, rows_computed{0};  // steps, and their rows summed (idle ones included)
};

class BatchExecutor {
 public:
  // max_rows: the most rows the policy runs together (SchedulerOptions::max_batch).
  BatchExecutor(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, int64_t prefill_chunk,
                DecodeMode mode, int64_t max_rows);
  ~BatchExecutor();

  // Prefills each admitted sequence alone and samples its first token; those that go on join the batch (in
  // one copy). A sequence whose request failed meanwhile is skipped; a failure fails its request alone.
  void join(std::vector<Admission> admissions);
  // The rows' requests in batch order (null: an idle row of a fixed-shape batch).
  std::vector<Ticket*> tickets() const;
  // The given rows (indices into tickets()) leave before the next step.
  void leave(const std::vector<size_t>& rows);
  // One step over the rows: batched forward, sampling, update. A failure of the forward fails every row's
  // request (a server fault); a row's sampling failure fails its request alone.
  void step();

  int64_t running() const { return running_; }  // rows decoding (idle rows not counted)
  int64_t room() const;                         // rows that may join now
  const ExecutorCounters& counters() const { return counters_; }

 private:
  struct Row;
  // Takes the sampled token into the row; true when the row is finished.
  bool take_token(Row& row, const at::Tensor& logits, int64_t id);
  void finish(Row& row, const std::string& reason);
  std::unique_ptr<Row> prefill_row(Admission admission, KVCache& cache);
  // Keeps the rows not in `gone` (sorted indices): eager, the cache drops them; fixed shapes, they go idle.
  void drop_rows(const std::vector<size_t>& gone);
  // Prefilled rows (each with its one-row cache) join: appended to a batch whose shapes are not fixed, placed
  // into idle rows of one that is, or kept for the next batch when their steps do not fit it.
  void add_rows(std::vector<std::unique_ptr<KVCache>> caches, std::vector<std::unique_ptr<Row>> rows);
  void note_cache();
  // Fixed shapes: rows in use move down into idle rows while that makes the step's bucket of rows smaller.
  void compact_rows();

  const CausalLM& model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t prefill_chunk_;
  DecodeMode mode_;
  int64_t max_rows_;
  int64_t sampled_ids_;  // ids the tokenizer has (a vocabulary padded past it holds no tokens)
  int64_t pad_id_;       // what an idle row feeds
  KVCache batch_;
  std::unique_ptr<DecodeSteps> steps_;      // made at the first step after rows joined
  std::vector<std::unique_ptr<Row>> rows_;  // null: an idle row (fixed shapes)
  // Fixed shapes: prefilled rows whose steps do not fit the running batch's slots; they start the next batch.
  std::vector<std::unique_ptr<KVCache>> deferred_caches_;
  std::vector<std::unique_ptr<Row>> deferred_rows_;
  int64_t running_ = 0;
  ExecutorCounters counters_;
};

}  // namespace archspace
