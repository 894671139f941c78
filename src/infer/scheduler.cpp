#include "archspace/infer/scheduler.h"

#include <c10/core/InferenceMode.h>

#include <string>

#include "archspace/util/error.h"

namespace archspace {

Scheduler::Scheduler(const CausalLM& model, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options)
    : model_(model),
      options_(options),
      executor_(model, std::move(tokenizer), options.prefill_chunk, options.decode_steps, options.max_batch),
      policy_(options.max_batch, options.max_queue) {
  if (!options.caller_drives) thread_ = std::thread([this] { loop(); });
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
  auto ticket = std::make_shared<Ticket>(sequences.size(), deadline);
  std::lock_guard lock(mutex_);
  if (stopping_ || !policy_.enqueue(ticket, std::move(sequences))) return nullptr;
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
  SchedulerStats s;
  {
    std::lock_guard lock(mutex_);
    s.running = running_;
    s.waiting = policy_.waiting();
  }
  const ExecutorCounters& c = executor_.counters();
  s.completed_sequences = c.completed_sequences;
  s.generated_tokens = c.generated_tokens;
  s.prompt_tokens = c.prompt_tokens;
  s.sampled_tokens = c.sampled_tokens;
  s.prefill_seconds = c.prefill_seconds;
  s.decode_seconds = c.decode_seconds;
  s.cache_bytes = c.peak_cache_bytes;
  s.cache_sliding_bytes = c.peak_sliding_bytes;
  s.cache_full_bytes = c.peak_full_bytes;
  s.decode_steps = c.decode_steps;
  s.rows_computed = c.rows_computed;
  return s;
}

void Scheduler::loop() {
  c10::InferenceMode inference;
  while (step()) {
  }
}

void Scheduler::drive(const std::function<void()>& after_step) {
  if (!options_.caller_drives) throw Error("Scheduler::drive: this engine runs its steps on its own thread");
  c10::InferenceMode inference;
  while (true) {
    {
      std::lock_guard lock(mutex_);
      if (policy_.idle() && executor_.running() == 0) return;
    }
    step();
    if (after_step) after_step();
  }
}

std::string Scheduler::drive(Ticket& ticket, const std::function<void(const Ticket::Event&)>& on_event) {
  drive([&] {
    while (const auto event = ticket.poll_event()) on_event(*event);
  });
  // drive() returns once every submitted request finished: an unfinished one is the engine's bug, not the caller's.
  if (!ticket.wait_for(std::chrono::milliseconds(0)))
    throw Error("the decoding engine stopped before the request finished");
  return ticket.error();
}

void Scheduler::run() {
  if (!options_.caller_drives) throw Error("Scheduler::run: this engine runs its steps on its own thread");
  loop();
}

bool Scheduler::step() {
  std::vector<Admission> admitted;
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || !policy_.idle() || executor_.running() > 0; });
    if (stopping_ && policy_.idle() && executor_.running() == 0) return false;
    admitted = policy_.admit(executor_.running(), executor_.room(), std::chrono::steady_clock::now());
    running_ = executor_.running() + static_cast<int64_t>(admitted.size());
  }
  executor_.join(std::move(admitted));
  executor_.leave(SchedulePolicy::leaving(executor_.tickets(), std::chrono::steady_clock::now()));
  executor_.step();
  std::lock_guard lock(mutex_);
  running_ = executor_.running();
  return true;
}

}  // namespace archspace
