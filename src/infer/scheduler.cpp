#include "archspace/infer/scheduler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>

#include "archspace/kernels/argmax.h"
#include "archspace/model/kv_cache.h"
#include "archspace/util/error.h"
#include "archspace/util/error_message.h"

namespace archspace {

// ---- Ticket -------------------------------------------------------------------------------------------------

std::optional<Ticket::Event> Ticket::next_event() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !events_.empty() || finished_count_ == finished_.size() || cancelled_; });
  if (events_.empty()) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Ticket::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_count_ == finished_.size(); });
}

bool Ticket::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return finished_count_ == finished_.size(); });
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

void Ticket::set_client_check(std::function<bool()> gone) {
  std::lock_guard lock(mutex_);
  client_gone_ = std::move(gone);
}

void Ticket::clear_client_check() {
  std::lock_guard lock(mutex_);
  client_gone_ = nullptr;
}

bool Ticket::check_client() {
  if (cancelled_) return true;
  std::lock_guard lock(mutex_);
  if (client_gone_ && finished_count_ < finished_.size() && client_gone_()) {
    cancelled_ = true;
    client_gone_ = nullptr;
    changed_.notify_all();
  }
  return cancelled_;
}

void Ticket::expire() {
  timed_out_ = true;
  fail("the request passed its deadline (--request-timeout) before it finished");
}

void Ticket::fail(const std::string& message) {
  cancelled_ = true;  // its other sequences leave the batch (or never join it)
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
  Penalties penalties;
  int64_t pending = -1;  // the token this row feeds at the next decode step
};

Scheduler::Scheduler(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      sampled_ids_(std::min<int64_t>(model.config().vocab_size, tokenizer_->vocab_size())) {
  if (options_.max_batch < 1)
    throw Error("--max-batch must be at least 1 (got " + std::to_string(options_.max_batch) + ")");
  if (options_.max_queue < 1) throw Error("--max-queue must be >= 1 (got " + std::to_string(options_.max_queue) + ")");
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Ticket> Scheduler::submit(std::vector<SequenceRequest> sequences,
                                          std::chrono::steady_clock::time_point deadline) {
  const auto count = static_cast<int64_t>(sequences.size());
  if (count == 0) throw Error("a request with no sequences");
  if (count > options_.max_queue) {
    throw Error("the request holds " + std::to_string(count) + " sequences (prompts x n), more than the " +
                std::to_string(options_.max_queue) + " the queue holds (--max-queue)");
  }
  // What would fail the shared decode step (a position past the model's, an id outside its table) is refused
  // here, for the request alone; the limits are checked without overflow.
  const int64_t positions = model_.config().max_position_embeddings, vocab = model_.config().vocab_size;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceRequest& s = sequences[i];
    const auto n = static_cast<int64_t>(s.prompt.size());
    const std::string which = "sequence " + std::to_string(i) + ": ";
    if (n == 0) throw Error(which + "empty prompt");
    if (s.max_tokens < 0 || n > positions || s.max_tokens > positions - n) {
      throw Error(which + "a prompt of " + std::to_string(n) + " tokens and max_tokens " +
                  std::to_string(s.max_tokens) + " do not fit max_position_embeddings " + std::to_string(positions));
    }
    for (uint32_t id : s.prompt) {
      if (static_cast<int64_t>(id) >= vocab)
        throw Error(which + "token id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(vocab));
    }
  }
  auto ticket = std::make_shared<Ticket>(sequences.size());
  ticket->deadline_ = deadline;
  std::lock_guard lock(mutex_);
  if (stopping_ || waiting_sequences_ + count > options_.max_queue) return nullptr;
  waiting_sequences_ += count;
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
  return {running_, waiting_sequences_, completed_, generated_, prompt_tokens_.load(), sampled_tokens_.load()};
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
  ++sampled_tokens_;
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
  row.penalties.add(id);
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
  row->text = CompletionText(sequence.stop_strings);  // shares the request's one list
  row->gen = at::make_generator<at::CPUGeneratorImpl>(sequence.sampling.seed);
  row->request = std::move(sequence);
  const SequenceRequest& r = row->request;
  row->penalties = Penalties(r.sampling, r.prompt, model_.config().vocab_size);

  at::Tensor first;  // [V]: the distribution of the first generated token (logits or log-probabilities)
  if (r.score_prompt) {
    ScoreOptions so;
    so.top_logprobs = std::max<int64_t>(r.logprobs, 0);
    auto scores = score_sequences(model_, {ScoreRequest{r.prompt, 1, r.max_tokens > 0}}, so);
    row->result.prompt_logprobs = std::move(scores[0].tokens);
    first = scores[0].next_logprobs;
  }
  prompt_tokens_ += static_cast<int64_t>(r.prompt.size());
  if (r.max_tokens == 0) {
    finish(*row, "length");
    return nullptr;
  }
  // Prefill alone, in chunks, as `generate` does for one prompt.
  auto prefill = [&] {
    RECORD_USER_SCOPE("archspace::prefill");
    const int64_t T = static_cast<int64_t>(r.prompt.size());
    at::Tensor ids = at::tensor(std::vector<int64_t>(r.prompt.begin(), r.prompt.end()), at::kLong).view({1, T});
    const DecodeOptions fwd{&joining, AttentionImpl::kSdpa, /*last_position_only=*/true};
    at::Tensor last;
    for (int64_t s = 0; s < T; s += options_.prefill_chunk) {
      const int64_t n = std::min<int64_t>(options_.prefill_chunk, T - s);
      last = model_.forward(ids.narrow(1, s, n).to(model_.device()), fwd);
    }
    return logits_to_float(last[0][0]);
  };
  const bool prefilled = !first.defined();
  if (prefilled) first = prefill();
  const int64_t id = sample_token(row->penalties.apply(first.narrow(0, 0, sampled_ids_)), r.sampling, row->gen);
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
      const auto now = std::chrono::steady_clock::now();
      // Requests that failed, were cancelled or expired while waiting leave the queue whole.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (now >= it->ticket->deadline_ && !it->ticket->cancelled()) it->ticket->expire();
        if (it->ticket->check_client()) {
          waiting_sequences_ -= static_cast<int64_t>(it->sequences.size() - it->next);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      while (static_cast<int64_t>(rows.size() + admissions.size()) < options_.max_batch && !waiting_.empty()) {
        Waiting& w = waiting_.front();
        admissions.push_back({w.ticket, w.next, std::move(w.sequences[w.next])});
        --waiting_sequences_;
        if (++w.next == w.sequences.size()) waiting_.pop_front();
      }
      running_ = static_cast<int64_t>(rows.size() + admissions.size());
    }
    // Each admitted sequence is prefilled alone into its own cache; the turn's caches then join the batch in one
    // copy (one at a time, the running batch would be copied again for every sequence: quadratic in the batch).
    std::vector<std::unique_ptr<KVCache>> joining_caches;
    std::vector<std::unique_ptr<Row>> joining_rows;
    for (Admission& a : admissions) {
      if (a.ticket->cancelled()) continue;  // a sibling sequence failed at its admission
      try {
        auto joining = std::make_unique<KVCache>(c);
        std::unique_ptr<Row> row = admit(a.ticket, a.index, std::move(a.sequence), *joining);
        if (row) {
          joining_caches.push_back(std::move(joining));
          joining_rows.push_back(std::move(row));
        }
      } catch (const std::exception& e) {
        a.ticket->fail(error_message(e));
      }
    }
    if (!joining_rows.empty()) {
      try {
        RECORD_USER_SCOPE("archspace::join_rows");  // a span in a profile (util/profiler.h)
        std::vector<const KVCache*> caches;
        for (const auto& joining : joining_caches) caches.push_back(joining.get());
        batch.append_rows(caches);
        for (auto& row : joining_rows) rows.push_back(std::move(row));
      } catch (const std::exception& e) {  // the joining rows' requests fail (a running row's next step will
                                           // fail too if the batch was left half joined)
        for (const auto& row : joining_rows) row->ticket->fail(error_message(e));
      }
      joining_caches.clear();  // their memory is the batch's now
    }
    // Rows whose client went away, or whose request failed or passed its deadline, leave before the step
    // (each request's client checked once).
    std::vector<int64_t> keep;
    const auto now = std::chrono::steady_clock::now();
    const Ticket* checked = nullptr;
    for (size_t r = 0; r < rows.size(); ++r) {
      Ticket& t = *rows[r]->ticket;
      if (now >= t.deadline_ && !t.cancelled()) t.expire();
      if (&t != checked) {
        t.check_client();
        checked = &t;
      }
      if (!t.cancelled()) keep.push_back(static_cast<int64_t>(r));
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
      RECORD_USER_SCOPE("archspace::decode_step");  // one span per step in a profile (util/profiler.h)
      at::Tensor ids = at::tensor(feed, at::kLong).view({static_cast<int64_t>(rows.size()), 1}).to(model_.device());
      at::Tensor logits = logits_to_float(model_.forward(ids, {AttentionImpl::kSdpa, &batch}).select(1, 0));  // [B, V]
      // Each row samples on its own: a failure there (a distribution that is not one) fails its request
      // alone, and the neighbours go on.
      for (size_t r = 0; r < rows.size(); ++r) {
        Row& row = *rows[r];
        if (row.ticket->cancelled()) continue;  // a sibling sequence of its request failed this step
        try {
          at::Tensor row_logits = logits[static_cast<int64_t>(r)];
          const int64_t id =
              sample_token(row.penalties.apply(row_logits.narrow(0, 0, sampled_ids_)), row.request.sampling, row.gen);
          if (!take_token(row, row_logits, id)) keep.push_back(static_cast<int64_t>(r));
        } catch (const std::exception& e) {
          row.ticket->fail(error_message(e));
        }
      }
      // Rows of a request that failed after they sampled leave too.
      std::erase_if(keep, [&](int64_t r) { return rows[r]->ticket->cancelled(); });
    } catch (const std::exception& e) {  // the batched forward: a server fault, shared by every row
      for (const auto& row : rows) row->ticket->fail(error_message(e));
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
