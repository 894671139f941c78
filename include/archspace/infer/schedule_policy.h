// The decoding engine's policy (vLLM's schedule()), apart from the model: the queue of waiting requests
// (bounded in sequences, so one request of many prompts x n counts as what it costs), which waiting sequences
// start (in arrival order, while the batch has room), and which requests end early (cancelled, their client
// gone, past their deadline), whether they still wait or already decode. It runs no forward and can be tested
// on fake requests; the execution (infer/batch_executor.h) does what it decides.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "archspace/infer/request.h"

namespace archspace {

// One waiting sequence the policy lets start: its request's ticket and its index there.
struct Admission {
  std::shared_ptr<Ticket> ticket;
  size_t index = 0;
  SequenceRequest sequence;
};

class SchedulePolicy {
 public:
  using Clock = std::chrono::steady_clock;

  // max_batch: rows decoded together; max_queue: sequences waiting to start. Throws for values below 1.
  SchedulePolicy(int64_t max_batch, int64_t max_queue);

  // Queues a request's sequences; false when the queue cannot take them now (HTTP 429). The caller checked
  // that they could ever run (count <= max_queue).
  bool enqueue(std::shared_ptr<Ticket> ticket, std::vector<SequenceRequest> sequences);
  bool idle() const { return waiting_.empty(); }      // nothing waits
  int64_t waiting() const { return waiting_count_; }  // sequences not yet admitted
  int64_t max_queue() const { return max_queue_; }

  // One turn's admissions. Requests that were cancelled, whose client left or that passed their deadline while
  // waiting leave the queue whole; then waiting sequences start in order while `running` + admitted rows stay
  // under max_batch and the admitted ones within `room` (the rows the execution can take now).
  std::vector<Admission> admit(int64_t running, int64_t room, Clock::time_point now);

  // Of the running rows (each row's request, in batch order; null: an idle row), those that leave before the
  // next step: their request expires now, was cancelled or failed, or its client is gone (each request's
  // client checked once a turn).
  static std::vector<size_t> leaving(const std::vector<Ticket*>& rows, Clock::time_point now);

 private:
  struct Waiting {
    std::shared_ptr<Ticket> ticket;
    std::vector<SequenceRequest> sequences;
    size_t next = 0;  // sequences admitted so far
  };
  int64_t max_batch_, max_queue_;
  std::deque<Waiting> waiting_;
  int64_t waiting_count_ = 0;  // not yet admitted, over waiting_
};

}  // namespace archspace
