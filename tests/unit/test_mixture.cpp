// Weighted source mixtures: the apportionment, the schedule's shares (every global batch, every run
// prefix of whole batches, every epoch), and the mixture's instances (each from the source the schedule
// names, each source's windows drawn evenly, a pure function of (seed, index)), and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "archspace/data/mixture_schedule.h"
#include "archspace/data/source_mixture.h"
#include "archspace/data/token_shards.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;
using archspace::testing::expect_error;
using archspace::testing::fresh_dir;
namespace fs = std::filesystem;

namespace {

// Random mixtures: 1 to 8 sources with skewed weights, global batches of 1 to 40, 1 to 30 batches.
struct Case {
  std::vector<double> ratios;
  uint64_t global_batch, batches;
};

std::vector<Case> random_cases(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<Case> out;
  for (int i = 0; i < n; ++i) {
    Case c;
    const int k = 1 + static_cast<int>(rng() % 8);
    double sum = 0;
    for (int s = 0; s < k; ++s) {
      c.ratios.push_back(std::pow(unit(rng), 3) + 1e-3);
      sum += c.ratios.back();
    }
    for (double& r : c.ratios) r /= sum;
    c.global_batch = 1 + rng() % 40;
    c.batches = 1 + rng() % 30;
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST(Apportion, LargestRemaindersSumToTheTotal) {
  EXPECT_EQ(apportion(10, {0.5, 0.3, 0.2}), (std::vector<uint64_t>{5, 3, 2}));
  EXPECT_EQ(apportion(10, {1, 1, 1}), (std::vector<uint64_t>{4, 3, 3}));         // the tie goes to the lower index
  EXPECT_EQ(apportion(7, {0.6, 0.25, 0.15}), (std::vector<uint64_t>{4, 2, 1}));  // 4.2, 1.75, 1.05
  for (const Case& c : random_cases(200, 1)) {
    const uint64_t total = c.global_batch * c.batches;
    const std::vector<uint64_t> n = apportion(total, c.ratios);
    uint64_t sum = 0;
    for (size_t s = 0; s < n.size(); ++s) {
      const double quota = static_cast<double>(total) * c.ratios[s];
      // floor or ceil of the quota; 1e-9 covers the quota's own rounding (a few ulp of numbers below 2^11)
      EXPECT_GE(static_cast<double>(n[s]), std::floor(quota - 1e-9));
      EXPECT_LE(static_cast<double>(n[s]), std::ceil(quota + 1e-9));
      sum += n[s];
    }
    EXPECT_EQ(sum, total);
  }
}

// The schedule's guarantees, position by position, on random mixtures.
TEST(MixtureSchedule, EveryBatchHoldsEachRatioWithinOneInstance) {
  int checked = 0;
  for (const Case& c : random_cases(300, 7)) {
    const uint64_t G = c.global_batch, B = c.batches, N = G * B;
    const std::vector<uint64_t> n = apportion(N, c.ratios);
    const MixtureSchedule schedule(n, G);
    ASSERT_EQ(schedule.epoch_instances(), N);
    const size_t k = n.size();
    std::vector<uint64_t> seen(k, 0);  // instances of each source so far
    for (uint64_t b = 0; b < B; ++b) {
      // Run prefix of b whole batches: within one instance of b G n_s / N (strictly), in integers:
      // |seen_s N - b G n_s| < N.
      EXPECT_EQ(schedule.before_batch(b), seen);
      for (size_t s = 0; s < k; ++s) {
        const int64_t diff = static_cast<int64_t>(seen[s] * N) - static_cast<int64_t>(b * G * n[s]);
        EXPECT_LT(std::llabs(diff), static_cast<int64_t>(N)) << "source " << s << " before batch " << b;
      }
      std::vector<uint64_t> in_batch(k, 0);
      for (uint64_t q = 0; q < G; ++q) {
        const MixtureSchedule::Slot slot = schedule.at(b * G + q);
        ASSERT_LT(slot.source, k);
        EXPECT_EQ(slot.occurrence, seen[slot.source]) << "each source's instances come in order";
        ++seen[slot.source];
        ++in_batch[slot.source];
      }
      EXPECT_EQ(schedule.in_batch(b), in_batch);
      for (size_t s = 0; s < k; ++s) {
        // Against the ratio as configured: floor or ceil of G r_s (1e-9: the rounding of G r_s in double).
        const double quota = static_cast<double>(G) * c.ratios[s];
        EXPECT_GE(static_cast<double>(in_batch[s]), std::floor(quota - 1e-9)) << "batch " << b << " source " << s;
        EXPECT_LE(static_cast<double>(in_batch[s]), std::ceil(quota + 1e-9)) << "batch " << b << " source " << s;
        // And exactly, against the epoch's own share n_s / N: floor or ceil of G n_s / N.
        EXPECT_GE(in_batch[s] * B, n[s] - n[s] % B);
        EXPECT_LE(in_batch[s] * B, n[s] + (B - n[s] % B) % B);
      }
      ++checked;
    }
    EXPECT_EQ(seen, n);  // the epoch holds each source's apportioned count
    EXPECT_EQ(schedule.before_batch(B), n);
  }
  EXPECT_GT(checked, 1000);
}

// The Dolmino shares of reproduce/olmo3-1b/stage2.toml at a global batch of 64: every batch, and every
// run prefix of whole batches.
TEST(MixtureSchedule, DolminoSharesPerGlobalBatch) {
  const std::vector<double> ratios = {0.275, 0.2, 0.2, 0.139, 0.075, 0.061, 0.05};
  const uint64_t G = 64, B = 500;
  const std::vector<uint64_t> n = apportion(G * B, ratios);
  const MixtureSchedule schedule(n, G);
  for (uint64_t b = 0; b < B; ++b) {
    const std::vector<uint64_t> in = schedule.in_batch(b);
    for (size_t s = 0; s < ratios.size(); ++s) {
      const double quota = static_cast<double>(G) * ratios[s];  // 17.6, 12.8, 12.8, 8.896, 4.8, 3.904, 3.2
      EXPECT_TRUE(in[s] == std::floor(quota) || in[s] == std::ceil(quota)) << b << " " << s << " " << in[s];
    }
  }
}

TEST(MixtureSchedule, IsAPureFunctionOfItsCounts) {
  const std::vector<uint64_t> n = apportion(24 * 50, {0.5, 0.3, 0.15, 0.05});
  const MixtureSchedule a(n, 24), b(n, 24);
  // b is read backwards and from the middle: no state carries from one position to the next.
  std::vector<MixtureSchedule::Slot> forward;
  for (uint64_t p = 0; p < a.epoch_instances(); ++p) forward.push_back(a.at(p));
  for (uint64_t p = a.epoch_instances(); p-- > 0;) {
    EXPECT_EQ(b.at(p).source, forward[p].source);
    EXPECT_EQ(b.at(p).occurrence, forward[p].occurrence);
  }
}

TEST(MixtureSchedule, RefusesCountsThatAreNotWholeBatches) {
  expect_error([] { MixtureSchedule({3, 4}, 2); }, {"7 instances", "global batch 2"});
  expect_error([] { MixtureSchedule({0, 0}, 2); }, {"0 instances"});
  expect_error([] { MixtureSchedule({}, 2); }, {"1 to 64 sources"});
}

namespace {

// A source whose window w (of `length` tokens) holds the token id `tag + w` throughout, so an instance
// names its source and window. `windows` windows in shards of `per_shard` windows.
std::string tagged_source(const fs::path& root, const std::string& name, uint32_t tag, int windows, int length,
                          int per_shard) {
  const std::string dir = (root / name).string();
  ShardWriter w(dir, static_cast<uint64_t>(per_shard * length));
  for (int i = 0; i < windows; ++i) w.add_document(std::vector<uint32_t>(length, tag + i));
  ShardManifest m;
  m.tokenizer_name = "test";
  m.tokenizer_sha256 = "0";
  m.vocab_size = 100000;
  m.eos_token_id = 0;
  w.finish(m);
  return dir;
}

}  // namespace

TEST(SourceMixture, InstancesComeFromTheScheduledSourceAndDrawItsWindowsEvenly) {
  const fs::path root = fresh_dir("mixture_draw");
  const int L = 8;
  MixtureSpec spec;
  // web: 30 windows in one path; code: 7 + 5 windows in two paths; math: 4 windows, read 2.5 times over.
  spec.sources = {
      {"web", {tagged_source(root, "web", 1000, 30, L, 7)}, 0.5, 1},
      {"code", {tagged_source(root, "code_a", 2000, 7, L, 3), tagged_source(root, "code_b", 2007, 5, L, 5)}, 0.3, 2},
      {"math", {tagged_source(root, "math", 3000, 4, L, 4)}, 0.2, 3}};
  spec.sequence_length = L;
  spec.global_batch = 10;
  spec.requested_tokens = 45 * L + 1;  // 46 instances: 5 whole global batches of 10, 50 instances
  spec.seed = 5;
  const SourceMixture mixture(spec, {});
  ASSERT_EQ(mixture.instances_per_epoch(), 50u);
  EXPECT_EQ(mixture.schedule().counts(), (std::vector<uint64_t>{25, 15, 10}));
  const uint64_t windows[] = {30, 12, 4}, tags[] = {1000, 2000, 3000};
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::map<uint32_t, int>> uses(3);
    for (uint64_t p = 0; p < 50; ++p) {
      const uint64_t index = epoch * 50 + p;
      const std::vector<uint32_t> ids = mixture.instance(index);
      ASSERT_EQ(ids.size(), size_t(L));
      EXPECT_EQ(std::set<uint32_t>(ids.begin(), ids.end()).size(), 1u) << "a window of one tagged document";
      const size_t s = mixture.source_of(index);
      ASSERT_GE(ids[0], tags[s]);
      ASSERT_LT(ids[0], tags[s] + windows[s]) << "instance " << index << " from source " << s;
      ++uses[s][ids[0]];
    }
    for (size_t s = 0; s < 3; ++s) {
      const uint64_t n = mixture.schedule().counts()[s];
      // Each pass over a source's windows is a permutation: every window floor or ceil of n / windows times.
      for (uint32_t w = 0; w < windows[s]; ++w) {
        const int used = uses[s].count(tags[s] + w) ? uses[s][tags[s] + w] : 0;
        EXPECT_GE(used, static_cast<int>(n / windows[s])) << s << " window " << w;
        EXPECT_LE(used, static_cast<int>((n + windows[s] - 1) / windows[s])) << s << " window " << w;
      }
    }
  }
  // Epochs draw other orders (the seed and the epoch key each source's permutations).
  int same = 0;
  for (uint64_t p = 0; p < 50; ++p) same += mixture.instance(p) == mixture.instance(50 + p);
  EXPECT_LT(same, 25);
  // Named counts of a global batch, in the sources' order.
  const auto counts = mixture.source_counts(10, 10);
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0], (std::pair<std::string, int64_t>{"web", 5}));
  EXPECT_EQ(counts[1], (std::pair<std::string, int64_t>{"code", 3}));
  EXPECT_EQ(counts[2], (std::pair<std::string, int64_t>{"math", 2}));
}

TEST(SourceMixture, ResumedAndDataParallelReadsAreTheSame) {
  const fs::path root = fresh_dir("mixture_pure");
  const int L = 4;
  MixtureSpec spec;
  spec.sources = {{"a", {tagged_source(root, "a", 100, 20, L, 6)}, 0.7, 1},
                  {"b", {tagged_source(root, "b", 500, 9, L, 9)}, 0.3, 2}};
  spec.sequence_length = L;
  spec.global_batch = 8;
  spec.requested_tokens = 24 * L;  // 3 batches an epoch
  spec.seed = 9;
  const SourceMixture uninterrupted(spec, {});
  std::vector<at::Tensor> expected;
  for (uint64_t step = 0; step < 8; ++step) expected.push_back(uninterrupted.batch(step * 8, 8));  // 2.7 epochs
  const SourceMixture resumed(spec, {});  // a new process from step 5
  for (uint64_t step = 5; step < 8; ++step) EXPECT_TRUE(at::equal(resumed.batch(step * 8, 8), expected[step])) << step;
  for (int world : {2, 4, 8}) {
    const SourceMixture rank_view(spec, {});
    for (uint64_t step = 0; step < 8; ++step) {
      std::vector<at::Tensor> parts;
      for (int r = world; r-- > 0;) parts.insert(parts.begin(), rank_view.rank_batch(step, 8, r, world));
      EXPECT_TRUE(at::equal(at::cat(parts), expected[step])) << "world " << world << " step " << step;
    }
  }
  spec.seed = 10;
  const SourceMixture other_seed(spec, {});
  EXPECT_FALSE(at::equal(other_seed.batch(0, 24), uninterrupted.batch(0, 24)));
}

TEST(SourceMixture, ASourceThatCannotSupplyItsShareIsNamed) {
  const fs::path root = fresh_dir("mixture_short");
  const int L = 4;
  MixtureSpec spec;
  spec.sources = {{"web", {tagged_source(root, "web", 100, 40, L, 40)}, 0.75, 1},
                  {"math", {tagged_source(root, "math", 500, 5, L, 5)}, 0.25, 2}};
  spec.sequence_length = L;
  spec.global_batch = 4;
  spec.requested_tokens = 40 * L;  // 40 instances: math needs 10 of its 5 windows, 2 times over: allowed
  spec.sources[1].label = "run.toml: key 'data.sources[1]' (source \"math\")";
  EXPECT_NO_THROW(SourceMixture(spec, {}));
  spec.requested_tokens = 44 * L;  // 44: math needs 11, 2.2 times over
  expect_error([&] { SourceMixture(spec, {}); },
               {"run.toml: key 'data.sources[1]' (source \"math\"): its ratio 0.25", "needs 44 tokens (11 instances",
                "hold 20 tokens (5 instances)", "2.2 times over", "max_repetition 2", "(10 instances)"});
  spec.sources[1].paths = {tagged_source(root, "tiny", 500, 1, L - 1, 1)};  // 3 tokens: no instance of 4
  expect_error([&] { SourceMixture(spec, {}); },
               {"data.sources[1]' (source \"math\")", "no complete instance of length 4"});
  spec.sources[1].label = "";
  expect_error([&] { SourceMixture(spec, {}); }, {"source \"math\": "});
}
