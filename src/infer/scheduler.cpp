#include "archspace/infer/scheduler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>

#include "archspace/model/kv_cache.h"
#include "archspace/util/error.h"

namespace archspace {

// ---- Ticket -------------------------------------------------------------------------------------------------

std::optional<Ticket::Event> Ticket::next_event() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !events_.empty() || finished_count_ == finished_.size(); });
  if (events_.empty()) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Ticket::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_count_ == finished_.size(); });
}

std::string Ticket::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void Ticket::push_text(size_t index, std::string text) {
  if (text.empty()) return;
  std::lock_guard lock(mutex_);
  events_.push_back({index, std::move(text), false});
  changed_.notify_all();
}

void Ticket::finish(size_t index, SequenceResult result) {
  std::lock_guard lock(mutex_);
  if (finished_[index]) return;
  results_[index] = std::move(result);
  finished_[index] = true;
  ++finished_count_;
  events_.push_back({index, "", true});
  changed_.notify_all();
}

void Ticket::fail(const std::string& message) {
  std::lock_guard lock(mutex_);
  if (error_.empty()) error_ = message;
  for (size_t i = 0; i < finished_.size(); ++i) {
    if (!finished_[i]) {
      finished_[i] = true;
      ++finished_count_;
    }
  }
  changed_.notify_all();
}

// ---- Scheduler ----------------------------------------------------------------------------------------------

struct Scheduler::Row {
  std::shared_ptr<Ticket> ticket;
  size_t index = 0;
  SequenceRequest request;
  SequenceResult result;
  CompletionText text;
  at::Generator gen;
  int64_t pending = -1;  // the token this row feeds at the next decode step
};

Scheduler::Scheduler(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      sampled_ids_(std::min<int64_t>(model.config().vocab_size, tokenizer_->vocab_size())) {
  if (options_.max_batch < 1)
    throw Error("--max-batch must be at least 1 (got " + std::to_string(options_.max_batch) + ")");
  if (options_.max_queue < 0) throw Error("--max-queue must be >= 0 (got " + std::to_string(options_.max_queue) + ")");
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Ticket> Scheduler::submit(std::vector<SequenceRequest> sequences) {
  auto ticket = std::make_shared<Ticket>(sequences.size());
  std::lock_guard lock(mutex_);
  if (stopping_ || static_cast<int64_t>(waiting_.size()) >= options_.max_queue) return nullptr;
  waiting_.push_back({ticket, std::move(sequences), 0});
  wake_.notify_all();
  return ticket;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return {running_, static_cast<int64_t>(waiting_.size()), completed_, generated_};
}

void Scheduler::finish(Row& row, const std::string& reason) {
  const std::string last = row.text.flush();
  row.ticket->push_text(row.index, last);
  row.result.text = row.text.text();
  row.result.finish_reason = reason;
  {
    std::lock_guard lock(mutex_);
    generated_ += static_cast<int64_t>(row.result.tokens.size());
    ++completed_;
  }
  row.ticket->finish(row.index, std::move(row.result));
}

bool Scheduler::take_token(Row& row, const at::Tensor& logits, int64_t id) {
  const SequenceRequest& r = row.request;
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), static_cast<uint32_t>(id)) != r.stop_ids.end()) {
    finish(row, "stop");
    return true;
  }
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

std::unique_ptr<Scheduler::Row> Scheduler::admit(const std::shared_ptr<Ticket>& ticket, size_t index,
                                                 SequenceRequest sequence, KVCache& joining) {
  auto row = std::make_unique<Row>();
  row->ticket = ticket;
  row->index = index;
  row->text = CompletionText(sequence.stop_strings);
  row->gen = at::make_generator<at::CPUGeneratorImpl>(sequence.sampling.seed);
  row->request = std::move(sequence);
  const SequenceRequest& r = row->request;

  at::Tensor first;  // [V]: the distribution of the first generated token (logits or log-probabilities)
  if (r.score_prompt) {
    ScoreOptions so;
    so.top_logprobs = std::max<int64_t>(r.logprobs, 0);
    auto scores = score_sequences(model_, {ScoreRequest{r.prompt, 1, r.max_tokens > 0}}, so);
    row->result.prompt_logprobs = std::move(scores[0].tokens);
    first = scores[0].next_logprobs;
  }
  if (r.max_tokens == 0) {
    finish(*row, "length");
    return nullptr;
  }
  // Prefill alone, in chunks, as `generate` does for one prompt.
  auto prefill = [&] {
    const int64_t T = static_cast<int64_t>(r.prompt.size());
    at::Tensor ids = at::tensor(std::vector<int64_t>(r.prompt.begin(), r.prompt.end()), at::kLong).view({1, T});
    const ForwardOptions fwd{AttentionImpl::kSdpa, &joining, /*last_position_only=*/true};
    at::Tensor last;
    for (int64_t s = 0; s < T; s += options_.prefill_chunk) {
      const int64_t n = std::min<int64_t>(options_.prefill_chunk, T - s);
      last = model_.forward(ids.narrow(1, s, n).to(model_.device()), fwd);
    }
    return last[0][0].to(at::kCPU, at::kFloat);
  };
  const bool prefilled = !first.defined();
  if (prefilled) first = prefill();
  const int64_t id = sample_token(first.narrow(0, 0, sampled_ids_), r.sampling, row->gen);
  if (take_token(*row, first, id)) return nullptr;  // one token was all it needed: no cache joins
  if (!prefilled) prefill();
  return row;
}

void Scheduler::loop() {
  c10::InferenceMode inference;
  const ModelConfig& c = model_.config();
  KVCache batch(c);
  std::vector<std::unique_ptr<Row>> rows;
  struct Admission {
    std::shared_ptr<Ticket> ticket;
    size_t index;
    SequenceRequest sequence;
  };
  while (true) {
    std::vector<Admission> admissions;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !rows.empty(); });
      if (stopping_ && waiting_.empty() && rows.empty()) break;
      while (static_cast<int64_t>(rows.size() + admissions.size()) < options_.max_batch && !waiting_.empty()) {
        Waiting& w = waiting_.front();
        if (!w.ticket->cancelled()) admissions.push_back({w.ticket, w.next, std::move(w.sequences[w.next])});
        if (w.ticket->cancelled() || ++w.next == w.sequences.size()) waiting_.pop_front();
      }
      running_ = static_cast<int64_t>(rows.size() + admissions.size());
    }
    for (Admission& a : admissions) {
      try {
        KVCache joining(c);
        std::unique_ptr<Row> row = admit(a.ticket, a.index, std::move(a.sequence), joining);
        if (row) {
          batch.append_rows(joining);
          rows.push_back(std::move(row));
        }
      } catch (const std::exception& e) {
        a.ticket->fail(e.what());
      }
    }
    // Rows whose client went away leave before the step.
    std::vector<int64_t> keep;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!rows[r]->ticket->cancelled()) keep.push_back(static_cast<int64_t>(r));
    }
    if (keep.size() != rows.size()) {
      std::vector<std::unique_ptr<Row>> kept;
      for (int64_t r : keep) kept.push_back(std::move(rows[r]));
      rows = std::move(kept);
      batch.keep_rows(keep);
    }
    if (rows.empty()) {
      std::lock_guard lock(mutex_);
      running_ = 0;
      continue;
    }

    // One decode step for the whole batch.
    keep.clear();
    try {
      std::vector<int64_t> feed;
      for (const auto& row : rows) feed.push_back(row->pending);
      at::Tensor ids = at::tensor(feed, at::kLong).view({static_cast<int64_t>(rows.size()), 1}).to(model_.device());
      at::Tensor logits =
          model_.forward(ids, {AttentionImpl::kSdpa, &batch}).select(1, 0).to(at::kCPU, at::kFloat);  // [B, V]
      for (size_t r = 0; r < rows.size(); ++r) {
        at::Tensor row_logits = logits[static_cast<int64_t>(r)];
        const int64_t id = sample_token(row_logits.narrow(0, 0, sampled_ids_), rows[r]->request.sampling, rows[r]->gen);
        if (!take_token(*rows[r], row_logits, id)) keep.push_back(static_cast<int64_t>(r));
      }
    } catch (const std::exception& e) {
      for (const auto& row : rows) row->ticket->fail(e.what());
      keep.clear();
    }
    if (keep.size() != rows.size()) {
      std::vector<std::unique_ptr<Row>> kept;
      for (int64_t r : keep) kept.push_back(std::move(rows[r]));
      rows = std::move(kept);
      batch.keep_rows(keep);
    }
    std::lock_guard lock(mutex_);
    running_ = static_cast<int64_t>(rows.size());
  }
}

}  // namespace archspace
