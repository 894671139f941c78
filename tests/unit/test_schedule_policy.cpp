// infer/schedule_policy: the decoding engine's policy on fake requests, without a model: admission in arrival
// order up to max_batch, a queue bounded in sequences, requests that end while they wait (cancelled, client
// gone, past their deadline) leaving the queue whole, admissions within the room the execution has, and the
// running rows that leave before a step.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <memory>
#include <vector>

#include "archspace/infer/schedule_policy.h"
#include "test_support.h"

using namespace archspace;
using Clock = std::chrono::steady_clock;
constexpr int64_t kAny = std::numeric_limits<int64_t>::max();  // room: the execution takes whatever is admitted

namespace {

std::vector<SequenceRequest> sequences(size_t n) {
  std::vector<SequenceRequest> out(n);
  for (size_t i = 0; i < n; ++i) out[i].prompt = {static_cast<uint32_t>(i + 1)};
  return out;
}

std::shared_ptr<Ticket> ticket(size_t n, Clock::time_point deadline = Clock::time_point::max()) {
  return std::make_shared<Ticket>(n, deadline);
}

TEST(SchedulerPolicy, AdmitsInArrivalOrderUpToTheBatchAndBoundsTheQueueInSequences) {
  SchedulePolicy policy(/*max_batch=*/2, /*max_queue=*/3);
  auto a = ticket(2), b = ticket(2), c = ticket(1);
  EXPECT_TRUE(policy.enqueue(a, sequences(2)));
  EXPECT_FALSE(policy.enqueue(b, sequences(2)));  // 2 + 2 > 3 sequences: busy
  EXPECT_TRUE(policy.enqueue(c, sequences(1)));
  EXPECT_EQ(policy.waiting(), 3);

  const auto now = Clock::now();
  auto first = policy.admit(/*running=*/1, kAny, now);  // one row free
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].ticket, a);
  EXPECT_EQ(first[0].index, 0u);
  EXPECT_EQ(first[0].sequence.prompt, std::vector<uint32_t>{1});
  EXPECT_EQ(policy.waiting(), 2);

  EXPECT_TRUE(policy.admit(/*running=*/2, kAny, now).empty());  // full
  auto next = policy.admit(/*running=*/0, kAny, now);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].ticket, a);
  EXPECT_EQ(next[0].index, 1u);
  EXPECT_EQ(next[1].ticket, c);
  EXPECT_TRUE(policy.idle());
  EXPECT_EQ(policy.waiting(), 0);
}

TEST(SchedulerPolicy, AdmitsNoMoreThanTheRoomTheExecutionHas) {
  SchedulePolicy policy(4, 8);
  ASSERT_TRUE(policy.enqueue(ticket(3), sequences(3)));
  EXPECT_TRUE(policy.admit(0, /*room=*/0, Clock::now()).empty());  // e.g. a fixed-shape batch with no idle row
  EXPECT_EQ(policy.waiting(), 3);
  EXPECT_EQ(policy.admit(0, /*room=*/1, Clock::now()).size(), 1u);
  EXPECT_EQ(policy.admit(1, kAny, Clock::now()).size(), 2u);
}

TEST(SchedulerPolicy, RequestsThatEndWhileWaitingLeaveTheQueueWhole) {
  SchedulePolicy policy(/*max_batch=*/8, /*max_queue=*/16);
  const auto now = Clock::now();
  auto cancelled = ticket(2), expired = ticket(3, now - std::chrono::milliseconds(1)), gone = ticket(1),
       fine = ticket(2), later = ticket(1, now + std::chrono::hours(1));
  cancelled->cancel();
  int checks = 0;
  gone->set_client_check([&] {
    ++checks;
    return true;
  });
  for (auto& t : {cancelled, expired, gone, fine, later})
    ASSERT_TRUE(policy.enqueue(t, sequences(t->results().size())));
  EXPECT_EQ(policy.waiting(), 9);

  auto admitted = policy.admit(0, kAny, now);
  ASSERT_EQ(admitted.size(), 3u);  // fine's two, later's one
  EXPECT_EQ(admitted[0].ticket, fine);
  EXPECT_EQ(admitted[1].ticket, fine);
  EXPECT_EQ(admitted[2].ticket, later);
  EXPECT_TRUE(policy.idle());
  EXPECT_EQ(policy.waiting(), 0);
  EXPECT_TRUE(expired->timed_out());
  EXPECT_NE(expired->error().find("deadline"), std::string::npos) << expired->error();
  EXPECT_TRUE(expired->wait_for(std::chrono::milliseconds(0)));  // its waiter is released
  EXPECT_TRUE(gone->cancelled());
  EXPECT_EQ(checks, 1);
  EXPECT_FALSE(fine->cancelled());
  EXPECT_FALSE(later->timed_out());
}

TEST(SchedulerPolicy, APartlyAdmittedRequestThatEndsTakesOnlyItsWaitingSequences) {
  SchedulePolicy policy(/*max_batch=*/1, /*max_queue=*/4);
  auto t = ticket(3);
  ASSERT_TRUE(policy.enqueue(t, sequences(3)));
  ASSERT_EQ(policy.admit(0, kAny, Clock::now()).size(), 1u);
  EXPECT_EQ(policy.waiting(), 2);
  t->cancel();
  EXPECT_TRUE(policy.admit(0, kAny, Clock::now()).empty());
  EXPECT_EQ(policy.waiting(), 0);
  EXPECT_TRUE(policy.enqueue(ticket(4), sequences(4)));  // the queue's room is back
}

TEST(SchedulerPolicy, RunningRowsOfEndedRequestsLeaveAndEachClientIsCheckedOnce) {
  const auto now = Clock::now();
  auto gone = ticket(2), expired = ticket(1, now), fine = ticket(2);
  int checks = 0;
  gone->set_client_check([&] {
    ++checks;
    return true;
  });
  // Batch order: gone's two rows apart, an idle row (fixed shapes), the others.
  const std::vector<Ticket*> rows = {gone.get(), fine.get(), nullptr, expired.get(), gone.get(), fine.get()};
  EXPECT_EQ(SchedulePolicy::leaving(rows, now), (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(checks, 1);
  EXPECT_TRUE(expired->timed_out());
  EXPECT_FALSE(fine->cancelled());
  EXPECT_TRUE(SchedulePolicy::leaving({fine.get(), nullptr}, now).empty());
}

TEST(SchedulerPolicy, LimitsBelowOneAreRefused) {
  archspace::testing::expect_error([] { SchedulePolicy(0, 1); }, {"--max-batch"});
  archspace::testing::expect_error([] { SchedulePolicy(1, 0); }, {"--max-queue"});
}

}  // namespace
