#include "archspace/infer/request.h"

namespace archspace {

std::optional<Ticket::Event> Ticket::next_event() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !events_.empty() || finished_count_ == finished_.size() || cancelled_; });
  if (events_.empty()) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::optional<Ticket::Event> Ticket::poll_event() {
  std::lock_guard lock(mutex_);
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

}  // namespace archspace
