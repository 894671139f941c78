#include "archspace/infer/batch_executor.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "archspace/infer/score.h"
#include "archspace/kernels/argmax.h"
#include "archspace/util/error_message.h"

namespace archspace {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  if (value > peak.load()) peak = value;  // one writer: the engine's thread
}
}  // namespace

struct BatchExecutor::Row {
  std::shared_ptr<Ticket> ticket;
  size_t index = 0;
  SequenceRequest request;
  SequenceResult result;
  CompletionText text;
  RowSampler sampler;
  int64_t pending = -1;  // the token this row feeds at the next decode step
};

BatchExecutor::BatchExecutor(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, int64_t prefill_chunk,
                             DecodeMode mode, int64_t max_rows)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      prefill_chunk_(prefill_chunk),
      mode_(mode),
      max_rows_(max_rows),
      sampled_ids_(std::min<int64_t>(model.config().vocab_size, tokenizer_->vocab_size())),
      pad_id_(model.config().pad_token_id && *model.config().pad_token_id < model.config().vocab_size
                  ? *model.config().pad_token_id
                  : 0),
      batch_(model.config()) {}

BatchExecutor::~BatchExecutor() = default;

int64_t BatchExecutor::room() const {
  if (mode_ == DecodeMode::kEager || !batch_.fixed_shapes()) return std::numeric_limits<int64_t>::max();
  if (!deferred_rows_.empty()) return 0;                 // they start the next batch first
  return static_cast<int64_t>(rows_.size()) - running_;  // idle rows
}

std::vector<Ticket*> BatchExecutor::tickets() const {
  std::vector<Ticket*> out;
  for (const auto& row : rows_) out.push_back(row ? row->ticket.get() : nullptr);
  return out;
}

void BatchExecutor::finish(Row& row, const std::string& reason) {
  const std::string last = row.text.flush();
  row.ticket->push_text(row.index, last);
  row.result.text = row.text.text();
  row.result.finish_reason = reason;
  counters_.generated_tokens += static_cast<int64_t>(row.result.tokens.size());
  ++counters_.completed_sequences;
  row.ticket->finish(row.index, std::move(row.result));
}

bool BatchExecutor::take_token(Row& row, const at::Tensor& logits, int64_t id) {
  const SequenceRequest& r = row.request;
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), static_cast<uint32_t>(id)) != r.stop_ids.end()) {
    finish(row, "stop");
    return true;
  }
  ++counters_.sampled_tokens;
  GeneratedToken token{static_cast<uint32_t>(id), 0, {}};
  if (r.logprobs >= 0) {
    at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);
    token.logprob = logp[id].item<float>();
    if (r.logprobs > 0) {
      auto [values, ids] = logp.topk(std::min<int64_t>(r.logprobs, logp.size(0)));
      for (int64_t i = 0; i < values.size(0); ++i)
        token.top.emplace_back(static_cast<uint32_t>(ids[i].item<int64_t>()), values[i].item<float>());
    }
  }
  row.result.tokens.push_back(std::move(token));
  const auto uid = static_cast<uint32_t>(id);
  const bool silent = r.skip_special_tokens && tokenizer_->is_special(uid);
  row.ticket->push_text(row.index, row.text.add(silent ? std::string() : tokenizer_->id_to_token(uid)));
  if (row.text.stopped()) {
    finish(row, "stop");
    return true;
  }
  if (static_cast<int64_t>(row.result.tokens.size()) >= r.max_tokens) {
    finish(row, "length");
    return true;
  }
  row.pending = id;
  return false;
}

std::unique_ptr<BatchExecutor::Row> BatchExecutor::prefill_row(Admission a, KVCache& cache) {
  auto row = std::make_unique<Row>();
  row->ticket = std::move(a.ticket);
  row->index = a.index;
  row->text = CompletionText(a.sequence.stop_strings);  // shares the request's one list
  row->sampler = RowSampler(a.sequence.sampling, a.sequence.prompt, model_.config().vocab_size);
  row->request = std::move(a.sequence);
  const SequenceRequest& r = row->request;

  at::Tensor first;  // [V]: the distribution of the first generated token (logits or log-probabilities)
  if (r.score_prompt) {
    ScoreOptions so;
    so.top_logprobs = std::max<int64_t>(r.logprobs, 0);
    auto scores = score_sequences(model_, {ScoreRequest{r.prompt, 1, r.max_tokens > 0}}, so);
    row->result.prompt_logprobs = std::move(scores[0].tokens);
    first = scores[0].next_logprobs;
  }
  counters_.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  if (r.max_tokens == 0) {
    finish(*row, "length");
    return nullptr;
  }
  // Prefill alone, in chunks: bounded activation memory for long prompts.
  auto prefill = [&] {
    RECORD_USER_SCOPE("archspace::prefill");  // a span in a profile (util/profiler.h)
    const auto start = std::chrono::steady_clock::now();
    const int64_t T = static_cast<int64_t>(r.prompt.size());
    at::Tensor ids = at::tensor(std::vector<int64_t>(r.prompt.begin(), r.prompt.end()), at::kLong).view({1, T});
    const DecodeOptions fwd{&cache, AttentionImpl::kSdpa, /*last_position_only=*/true};
    at::Tensor last;
    for (int64_t s = 0; s < T; s += prefill_chunk_) {
      const int64_t n = std::min<int64_t>(prefill_chunk_, T - s);
      last = model_.forward(ids.narrow(1, s, n).to(model_.device()), fwd);
    }
    at::Tensor logits = logits_to_float(last[0][0]);
    counters_.prefill_seconds = counters_.prefill_seconds + seconds_since(start);
    return logits;
  };
  const bool prefilled = !first.defined();
  if (prefilled) first = prefill();
  const int64_t id = row->sampler.next(first, sampled_ids_);
  if (take_token(*row, first, id)) return nullptr;  // one token was all it needed: no cache joins
  if (!prefilled) prefill();
  return row;
}

void BatchExecutor::join(std::vector<Admission> admissions) {
  // Each admitted sequence is prefilled alone into its own cache; the turn's caches then join the batch in one
  // copy (one at a time, the running batch would be copied again for every sequence: quadratic in the batch).
  std::vector<std::unique_ptr<KVCache>> caches;
  std::vector<std::unique_ptr<Row>> joining;
  for (Admission& a : admissions) {
    if (a.ticket->cancelled()) continue;  // a sibling sequence failed at its admission
    std::shared_ptr<Ticket> ticket = a.ticket;
    try {
      auto cache = std::make_unique<KVCache>(model_.config());
      std::unique_ptr<Row> row = prefill_row(std::move(a), *cache);
      if (row) {
        caches.push_back(std::move(cache));
        joining.push_back(std::move(row));
      }
    } catch (const std::exception& e) {
      ticket->fail(error_message(e));
    }
  }
  if (!joining.empty()) add_rows(std::move(caches), std::move(joining));
}

void BatchExecutor::add_rows(std::vector<std::unique_ptr<KVCache>> caches, std::vector<std::unique_ptr<Row>> rows) {
  RECORD_USER_SCOPE("archspace::join_rows");  // a span in a profile (util/profiler.h)
  if (batch_.fixed_shapes()) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t steps = rows[i]->request.max_tokens - static_cast<int64_t>(rows[i]->result.tokens.size());
      const auto idle = std::find(rows_.begin(), rows_.end(), nullptr);
      if (!deferred_rows_.empty() || idle == rows_.end() || !batch_.fits(*caches[i], steps)) {
        deferred_caches_.push_back(std::move(caches[i]));
        deferred_rows_.push_back(std::move(rows[i]));
        continue;
      }
      try {
        batch_.place_row(idle - rows_.begin(), *caches[i]);
        *idle = std::move(rows[i]);
        ++running_;
      } catch (const std::exception& e) {
        rows[i]->ticket->fail(error_message(e));
      }
    }
    note_cache();
    return;
  }
  try {
    std::vector<const KVCache*> parts;
    for (const auto& cache : caches) parts.push_back(cache.get());
    batch_.append_rows(parts);
    for (auto& row : rows) rows_.push_back(std::move(row));
    running_ += static_cast<int64_t>(rows.size());
    steps_.reset();  // the batch changed
    note_cache();
  } catch (const std::exception& e) {  // the joining rows' requests fail (a running row's next step will fail
                                       // too if the batch was left half joined)
    for (const auto& row : rows)
      if (row) row->ticket->fail(error_message(e));
  }
}

void BatchExecutor::drop_rows(const std::vector<size_t>& gone) {
  if (gone.empty()) return;
  if (batch_.fixed_shapes()) {  // the rows go idle; the batch keeps its shape (and a CUDA graph its memory)
    for (size_t r : gone) {
      if (!rows_[r]) continue;
      rows_[r].reset();
      batch_.leave_row(static_cast<int64_t>(r));
      --running_;
    }
    if (running_ == 0) {  // the batch is over: the next one starts with the rows that did not fit it
      rows_.clear();
      steps_.reset();
      batch_ = KVCache(model_.config());
      if (!deferred_rows_.empty()) add_rows(std::move(deferred_caches_), std::move(deferred_rows_));
      deferred_caches_.clear();
      deferred_rows_.clear();
    }
    return;
  }
  std::vector<int64_t> keep;
  std::vector<std::unique_ptr<Row>> kept;
  for (size_t r = 0, g = 0; r < rows_.size(); ++r) {
    if (g < gone.size() && gone[g] == r) {
      ++g;
      continue;
    }
    keep.push_back(static_cast<int64_t>(r));
    kept.push_back(std::move(rows_[r]));
  }
  rows_ = std::move(kept);
  running_ = static_cast<int64_t>(rows_.size());
  batch_.keep_rows(keep);
}

void BatchExecutor::leave(const std::vector<size_t>& rows) { drop_rows(rows); }

void BatchExecutor::step() {
  if (running_ == 0) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<size_t> gone;
  try {
    if (!steps_) {
      // Fixed shapes are reserved for the longest the rows can still go: each forward feeds one token of a row
      // that has tokens left to sample.
      int64_t longest = 1;
      for (const auto& row : rows_)
        if (row)
          longest =
              std::max<int64_t>(longest, row->request.max_tokens - static_cast<int64_t>(row->result.tokens.size()));
      // Fixed shapes: room for sequences to join, up to the next power of two of the rows (and max_rows).
      const auto held = static_cast<int64_t>(rows_.size());
      const int64_t rows =
          mode_ == DecodeMode::kEager ? 0 : std::max(held, std::min(decode_rows_bucket(held, held * 2), max_rows_));
      steps_ = std::make_unique<DecodeSteps>(model_, batch_, mode_, batch_.length() + longest, rows);
      if (rows > held) rows_.resize(rows);  // idle rows
    }
    // Fixed shapes: the step computes the rows up to the highest in use, rounded up to a bucket.
    int64_t computed = static_cast<int64_t>(rows_.size());
    if (batch_.fixed_shapes()) {
      compact_rows();
      computed = decode_rows_bucket(batch_.rows_in_use(), computed);
    }
    ++counters_.decode_steps;
    counters_.rows_computed += computed;
    std::vector<int64_t> feed;
    for (int64_t r = 0; r < computed; ++r) feed.push_back(rows_[r] ? rows_[r]->pending : pad_id_);
    const at::Tensor logits = logits_to_float(steps_->step(feed));  // [computed, V]
    // Each row samples on its own: a failure there (a distribution that is not one) fails its request alone,
    // and the neighbours go on.
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (!rows_[r]) continue;
      Row& row = *rows_[r];
      if (row.ticket->cancelled()) {  // a sibling sequence of its request failed this step
        gone.push_back(r);
        continue;
      }
      try {
        const at::Tensor row_logits = logits[static_cast<int64_t>(r)];
        if (take_token(row, row_logits, row.sampler.next(row_logits, sampled_ids_))) gone.push_back(r);
      } catch (const std::exception& e) {
        row.ticket->fail(error_message(e));
        gone.push_back(r);
      }
    }
    // Rows of a request that failed after they sampled leave too.
    for (size_t r = 0; r < rows_.size(); ++r)
      if (rows_[r] && rows_[r]->ticket->cancelled() && std::find(gone.begin(), gone.end(), r) == gone.end())
        gone.push_back(r);
    std::sort(gone.begin(), gone.end());
  } catch (const std::exception& e) {  // the batched forward: a server fault, shared by every row
    gone.clear();
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (!rows_[r]) continue;
      rows_[r]->ticket->fail(error_message(e));
      gone.push_back(r);
    }
  }
  note_cache();
  drop_rows(gone);
  counters_.decode_seconds = counters_.decode_seconds + seconds_since(start);
}

void BatchExecutor::compact_rows() {
  const auto rows = static_cast<int64_t>(rows_.size());
  while (decode_rows_bucket(batch_.rows_in_use(), rows) > decode_rows_bucket(running_, rows)) {
    const int64_t from = batch_.rows_in_use() - 1;
    const auto to = static_cast<int64_t>(std::find(rows_.begin(), rows_.end(), nullptr) - rows_.begin());
    batch_.move_row(from, to);
    rows_[to] = std::move(rows_[from]);
  }
}

void BatchExecutor::note_cache() {
  raise_to(counters_.peak_cache_bytes, batch_.bytes());
  raise_to(counters_.peak_sliding_bytes, batch_.bytes(LayerType::kSliding));
  raise_to(counters_.peak_full_bytes, batch_.bytes(LayerType::kFull));
}

}  // namespace archspace
