#include "archspace/infer/schedule_policy.h"

#include <algorithm>
#include <string>

#include "archspace/util/error.h"

namespace archspace {

SchedulePolicy::SchedulePolicy(int64_t max_batch, int64_t max_queue) : max_batch_(max_batch), max_queue_(max_queue) {
  if (max_batch < 1) throw Error("--max-batch must be at least 1 (got " + std::to_string(max_batch) + ")");
  if (max_queue < 1) throw Error("--max-queue must be >= 1 (got " + std::to_string(max_queue) + ")");
}

bool SchedulePolicy::enqueue(std::shared_ptr<Ticket> ticket, std::vector<SequenceRequest> sequences) {
  const auto count = static_cast<int64_t>(sequences.size());
  if (waiting_count_ + count > max_queue_) return false;
  waiting_count_ += count;
  waiting_.push_back({std::move(ticket), std::move(sequences), 0});
  return true;
}

std::vector<Admission> SchedulePolicy::admit(int64_t running, int64_t room, Clock::time_point now) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Ticket& t = *it->ticket;
    if (now >= t.deadline_ && !t.cancelled()) t.expire();
    if (t.check_client()) {
      waiting_count_ -= static_cast<int64_t>(it->sequences.size() - it->next);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<Admission> admitted;
  while (running + static_cast<int64_t>(admitted.size()) < max_batch_ && static_cast<int64_t>(admitted.size()) < room &&
         !waiting_.empty()) {
    Waiting& w = waiting_.front();
    admitted.push_back({w.ticket, w.next, std::move(w.sequences[w.next])});
    --waiting_count_;
    if (++w.next == w.sequences.size()) waiting_.pop_front();
  }
  return admitted;
}

std::vector<size_t> SchedulePolicy::leaving(const std::vector<Ticket*>& rows, Clock::time_point now) {
  std::vector<size_t> leave;
  std::vector<const Ticket*> checked;  // a request's rows are few and mostly adjacent: a short list will do
  for (size_t r = 0; r < rows.size(); ++r) {
    Ticket* t = rows[r];
    if (!t) continue;
    if (now >= t->deadline_ && !t->cancelled()) t->expire();
    if (std::find(checked.begin(), checked.end(), t) == checked.end()) {
      t->check_client();
      checked.push_back(t);
    }
    if (t->cancelled()) leave.push_back(r);
  }
  return leave;
}

}  // namespace archspace
