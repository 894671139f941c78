// infer/scheduler: a request that fails (its sampling throws) fails alone, its batch neighbours' tokens
// unchanged; sequences that would fail the shared decode step (positions past the model's, ids outside the
// vocabulary, a length that overflows) are refused at submit; sampling is stable for tiny temperature/top_p;
// a seeded request samples the same tokens alone, in a batch, and from `generate`; a caller-driven engine gives
// the engine thread's tokens.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "archspace/config/model_config.h"
#include "archspace/infer/scheduler.h"
#include "test_support.h"

using namespace archspace;
using archspace::testing::expect_error;

namespace {

SequenceRequest greedy(std::vector<uint32_t> prompt, int64_t max_tokens) {
  SequenceRequest s;
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  return s;
}

std::vector<uint32_t> ids_of(const SequenceResult& r) {
  std::vector<uint32_t> out;
  for (const auto& t : r.tokens) out.push_back(t.id);
  return out;
}

struct SchedulerTest : ::testing::Test {
  CausalLM model = CausalLM::random_init(preset("tiny"), 21);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::load("dolma2");
};

TEST_F(SchedulerTest, AFailingRequestFailsAloneAndItsNeighboursKeepTheirTokens) {
  const std::vector<uint32_t> a = {5, 17, 300, 42, 9}, b = {7, 8, 9};
  std::vector<uint32_t> alone_a, alone_b;
  {
    Scheduler s(model, tokenizer, {});
    auto ta = s.submit({greedy(a, 24)});
    auto tb = s.submit({greedy(b, 24)});
    ta->wait();
    tb->wait();
    alone_a = ids_of(ta->results()[0]);
    alone_b = ids_of(tb->results()[0]);
  }
  ASSERT_EQ(alone_a.size(), 24u);  // eos is id 0: greedy on a random model runs to the length here

  Scheduler s(model, tokenizer, {});
  auto ta = s.submit({greedy(a, 24)});
  ASSERT_TRUE(ta->next_event());  // a is decoding when the bad request joins
  SequenceRequest bad = greedy(b, 24);
  bad.sampling.temperature = std::numeric_limits<double>::quiet_NaN();  // no distribution to sample from
  auto tbad = s.submit({greedy(b, 24), bad, greedy(b, 24)});            // its sibling sequences go with it
  auto tb = s.submit({greedy(b, 24)});
  tbad->wait();
  ta->wait();
  tb->wait();
  EXPECT_FALSE(tbad->error().empty());
  EXPECT_EQ(tbad->error().find("Exception raised from"), std::string::npos) << tbad->error();  // no backtrace
  EXPECT_TRUE(ta->error().empty());
  EXPECT_TRUE(tb->error().empty());
  EXPECT_EQ(ids_of(ta->results()[0]), alone_a);
  EXPECT_EQ(ids_of(tb->results()[0]), alone_b);
  s.stop();
  EXPECT_EQ(s.stats().running, 0);
}

TEST_F(SchedulerTest, SequencesThatWouldFailTheBatchAreRefusedAtSubmit) {
  Scheduler s(model, tokenizer, {});
  const int64_t positions = model.config().max_position_embeddings;
  expect_error(
      [&] {
        s.submit({greedy({1, 2}, std::numeric_limits<int64_t>::max())});
      },
      {"sequence 0", "max_position_embeddings"});  // 2 + 2^63-1 would wrap below the limit
  expect_error([&] { s.submit({greedy(std::vector<uint32_t>(positions - 1, 3), 2)}); }, {"max_position_embeddings"});
  expect_error([&] { s.submit({greedy({1}, 1), greedy({600}, 1)}); }, {"sequence 1", "token id 600"});
  expect_error([&] { s.submit({greedy({}, 1)}); }, {"empty prompt"});
  auto ok = s.submit({greedy(std::vector<uint32_t>(positions - 2, 3), 2)});  // exactly fills the positions
  ok->wait();
  EXPECT_TRUE(ok->error().empty()) << ok->error();
  EXPECT_EQ(ok->results()[0].tokens.size(), 2u);
}

TEST_F(SchedulerTest, TheQueueCountsSequencesAndDeadlinesEndRequests) {
  SchedulerOptions o;
  o.max_batch = 1;
  o.max_queue = 3;
  Scheduler s(model, tokenizer, o);
  const auto start = std::chrono::steady_clock::now();
  auto running = s.submit({greedy({5, 6}, 4000)}, start + std::chrono::milliseconds(300));
  ASSERT_TRUE(running->next_event());  // admitted: it no longer waits
  auto three = s.submit({greedy({7}, 2), greedy({8}, 2), greedy({9}, 2)});
  ASSERT_TRUE(three);
  EXPECT_EQ(s.stats().waiting, 3);
  EXPECT_EQ(s.submit({greedy({7}, 2)}), nullptr);  // 3 + 1 > 3: busy (429)
  expect_error([&] { s.submit(std::vector<SequenceRequest>(4, greedy({7}, 2))); }, {"4 sequences", "--max-queue"});
  running->wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(running->timed_out());
  EXPECT_NE(running->error().find("deadline"), std::string::npos) << running->error();
  EXPECT_LT(seconds, 5.0);
  three->wait();
  EXPECT_TRUE(three->error().empty());
  EXPECT_EQ(three->results()[2].tokens.size(), 2u);
}

// One sampler: a seeded request draws the same tokens from `generate` (alone, or as row i of a batch seeded
// seed - i), from the engine alone, and from the engine while it joins a batch of other requests mid-decode.
TEST_F(SchedulerTest, ASeededRequestSamplesTheSameTokensAloneInABatchAndFromGenerate) {
  const std::vector<uint32_t> prompt = {5, 17, 300, 42, 9}, other = {7, 8, 9}, third = {11, 12, 13, 14, 15, 16, 17};
  SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.top_p = 0.95;
  sampling.seed = 7;
  const int64_t n = 16;
  auto request = [&](std::vector<uint32_t> p, uint64_t seed, int64_t max_tokens) {
    SequenceRequest s = greedy(std::move(p), max_tokens);
    s.sampling = sampling;
    s.sampling.seed = seed;
    return s;
  };

  std::vector<uint32_t> alone;
  {
    Scheduler s(model, tokenizer, {});
    auto t = s.submit({request(prompt, 7, n)});
    t->wait();
    ASSERT_TRUE(t->error().empty()) << t->error();
    alone = ids_of(t->results()[0]);
  }
  ASSERT_EQ(alone.size(), static_cast<size_t>(n));

  {  // joining a running batch of other requests (left-padded: shorter and longer prompts decode beside it)
    Scheduler s(model, tokenizer, {});
    auto before = s.submit({request(other, 1, 40), request(third, 2, 40)});
    ASSERT_TRUE(before->next_event());  // they decode when the request joins
    auto t = s.submit({request(prompt, 7, n)});
    auto after = s.submit({request(third, 3, 8)});
    t->wait();
    before->wait();
    after->wait();
    EXPECT_EQ(ids_of(t->results()[0]), alone);
  }

  GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling = sampling;
  auto generated = [&](const std::vector<std::vector<uint32_t>>& prompts, uint64_t seed, size_t row) {
    o.sampling.seed = seed;
    return generate(model, *tokenizer, prompts, o, [](size_t, const std::string&) {}).completions[row].ids;
  };
  EXPECT_EQ(generated({prompt}, 7, 0), alone);
  EXPECT_EQ(generated({other, prompt, third}, 6, 1), alone);  // row 1 samples with seed 6 + 1
  // It is sampling: another seed draws other tokens, and greedy decoding differs from the draws.
  EXPECT_NE(generated({prompt}, 8, 0), alone);
  o.sampling.temperature = 0;
  EXPECT_NE(generated({prompt}, 7, 0), alone);
}

// The engine with fixed-shape decode steps (generate --decode-steps fixed-shapes): requests that arrive while a
// batch decodes take the rows finished ones left (or wait for the next batch), and every request's tokens equal
// the eager engine's.
TEST_F(SchedulerTest, FixedShapeStepsGiveTheEagerTokensWhileRowsJoinAndLeave) {
  const std::vector<SequenceRequest> requests = {greedy({5, 17, 300, 42, 9}, 30), greedy({7, 8, 9}, 4),
                                                 greedy({11, 12, 13, 14, 15, 16, 17}, 6), greedy({3, 4}, 5)};
  auto run = [&](DecodeMode mode) {
    SchedulerOptions o;
    o.max_batch = 2;
    o.decode_steps = mode;
    Scheduler s(model, tokenizer, o);
    auto first = s.submit({requests[0], requests[1]});  // start the batch together
    EXPECT_TRUE(first->next_event());
    auto third = s.submit({requests[2]}), fourth = s.submit({requests[3]});
    for (const auto& t : {first, third, fourth}) {
      t->wait();
      EXPECT_TRUE(t->error().empty()) << t->error();
    }
    return std::vector<std::vector<uint32_t>>{ids_of(first->results()[0]), ids_of(first->results()[1]),
                                              ids_of(third->results()[0]), ids_of(fourth->results()[0])};
  };
  std::vector<std::vector<uint32_t>> eager, fixed;
  eager = run(DecodeMode::kEager);
  fixed = run(DecodeMode::kFixedShapes);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(eager[i].size(), static_cast<size_t>(requests[i].max_tokens)) << i;
    EXPECT_EQ(fixed[i], eager[i]) << "request " << i;
  }
}

// A fixed-shape batch started by 3 sequences with max_batch 8 has 4 rows (a power of two: room to join), and its
// steps compute a bucket of its first rows (4, 2, 1) as sequences finish, the last in use moved down into an idle
// row: 6 sequences of different lengths, 3 joining later, give eager decoding's tokens, token for token, and the
// steps computed fewer rows than the batch holds.
TEST_F(SchedulerTest, FixedShapeStepsComputeBucketsOfRowsAndGiveTheEagerTokens) {
  // The longest starts in row 2: once it runs alone, it moves down to row 0.
  const std::vector<SequenceRequest> requests = {
      greedy({5, 17, 300, 42, 9}, 7), greedy({7, 8, 9}, 3), greedy({11, 12, 13, 14, 15, 16, 17}, 25), greedy({3, 4}, 5),
      greedy({21, 22, 23, 24}, 9),    greedy({30, 31}, 4)};
  SchedulerStats stats;
  auto run = [&](DecodeMode mode) {
    SchedulerOptions o;
    o.max_batch = 8;
    o.decode_steps = mode;
    Scheduler s(model, tokenizer, o);
    auto first = s.submit({requests[0], requests[1], requests[2]});  // start the batch together
    EXPECT_TRUE(first->next_event());
    auto later = s.submit({requests[3], requests[4], requests[5]});
    for (const auto& t : {first, later}) {
      t->wait();
      EXPECT_TRUE(t->error().empty()) << t->error();
    }
    stats = s.stats();
    std::vector<std::vector<uint32_t>> out;
    for (const auto& t : {first, later})
      for (const auto& r : t->results()) out.push_back(ids_of(r));
    return out;
  };
  const auto eager = run(DecodeMode::kEager);
  const auto fixed = run(DecodeMode::kFixedShapes);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(eager[i].size(), static_cast<size_t>(requests[i].max_tokens)) << i;
    EXPECT_EQ(fixed[i], eager[i]) << "request " << i;
  }
  // The longest sequence runs alone at the end: steps of one row, where the batch has 4 (or more, if it grew).
  EXPECT_GT(stats.decode_steps, 0);
  EXPECT_LT(stats.rows_computed, 4 * stats.decode_steps);
  std::printf("fixed shapes: %lld steps computed %lld rows\n", static_cast<long long>(stats.decode_steps),
              static_cast<long long>(stats.rows_computed));
}

// caller_drives (what `generate` and `eval downstream` use): the caller's thread runs the steps; the requests'
// tokens and streamed text equal the engine thread's, more requests than max_batch included (they wait, then
// join), and drive() on an engine with its own thread is refused.
TEST_F(SchedulerTest, ACallerDrivenEngineGivesTheEngineThreadsTokensAndText) {
  const std::vector<SequenceRequest> requests = {greedy({5, 17, 300, 42, 9}, 12), greedy({7, 8, 9}, 5),
                                                 greedy({11, 12, 13, 14, 15, 16, 17}, 9)};
  auto run = [&](bool caller_drives) {
    SchedulerOptions o;
    o.max_batch = 2;
    o.caller_drives = caller_drives;
    Scheduler s(model, tokenizer, o);
    auto t = s.submit(requests);
    std::vector<std::string> streamed(requests.size());
    size_t finals = 0;
    auto take = [&](const Ticket::Event& e) {
      streamed[e.index] += e.text;
      finals += e.final;
    };
    if (caller_drives) {
      s.drive([&] {
        while (const auto e = t->poll_event()) take(*e);
      });
      EXPECT_FALSE(t->poll_event());  // every event was taken after the step that made it
    } else {
      while (const auto e = t->next_event()) take(*e);
    }
    EXPECT_TRUE(t->wait_for(std::chrono::milliseconds(0)));
    EXPECT_TRUE(t->error().empty()) << t->error();
    EXPECT_EQ(finals, requests.size());
    std::vector<std::pair<std::vector<uint32_t>, std::string>> out;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(streamed[i], t->results()[i].text) << i;
      out.emplace_back(ids_of(t->results()[i]), t->results()[i].text);
    }
    return out;
  };
  const auto threaded = run(false), driven = run(true);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(driven[i].first.size(), static_cast<size_t>(requests[i].max_tokens)) << i;
    EXPECT_EQ(driven[i], threaded[i]) << "request " << i;
  }
  Scheduler threaded_engine(model, tokenizer, {});
  expect_error([&] { threaded_engine.drive({}); }, {"own thread"});
}

TEST(Sampling, TinyTemperatureIsGreedyAndTinyTopPKeepsTheMostLikely) {
  at::manual_seed(3);
  const at::Tensor logits = at::randn({512}) * 4;
  const int64_t best = logits.argmax().item<int64_t>();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  for (double t : {2e-39, 1e-300, 5e-324, 9e-6}) {
    SamplingOptions o;
    o.temperature = t;
    EXPECT_EQ(sample_token(logits, o, gen), best) << t;
  }
  for (double p : {1e-300, 1e-30, 1e-3}) {
    SamplingOptions o;
    o.temperature = 1.0;
    o.top_p = p;
    for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits, o, gen), best) << p;
  }
  SamplingOptions nan;
  nan.temperature = std::nan("");
  EXPECT_ANY_THROW(sample_token(logits, nan, gen));
}

}  // namespace
