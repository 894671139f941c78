// Token shards and the instance loader: format, order as a pure function of (seed, index), resume and
// rank splits, and errors for damaged shards and manifests.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "archspace/data/instance_loader.h"
#include "archspace/data/token_shards.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;
namespace fs = std::filesystem;

namespace {

// Shards of `docs` documents whose token t is (t * 7919) % vocab, EOS (id 0) after each document.
std::string make_shards(const std::string& name, int docs, int doc_len, uint64_t shard_tokens, int64_t vocab = 1000) {
  fs::path dir = fs::temp_directory_path() / ("archspace_data_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ShardWriter w(dir.string(), shard_tokens);
  uint64_t t = 0;
  for (int d = 0; d < docs; ++d) {
    std::vector<uint32_t> ids;
    for (int i = 0; i < doc_len; ++i) ids.push_back(1 + (t++ * 7919) % (vocab - 1));
    ids.push_back(0);
    w.add_document(ids);
  }
  ShardManifest m;
  m.tokenizer_name = "test";
  m.tokenizer_sha256 = "0";
  m.vocab_size = vocab;
  m.eos_token_id = 0;
  w.finish(m);
  return dir.string();
}

using archspace::testing::expect_error;

}  // namespace

TEST(IndexPermutation, IsABijectionAndKeyed) {
  for (uint64_t n : {1ull, 2ull, 3ull, 10ull, 1000ull, 4097ull}) {
    IndexPermutation p(n, 42);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(p(i));
    EXPECT_EQ(seen.size(), n);
    EXPECT_EQ(*seen.rbegin(), n - 1);
  }
  IndexPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);  // different keys: nearly unrelated orders
}

TEST(ShardWriter, RollsOverAndRecordsCounts) {
  std::string dir = make_shards("roll", 10, 99, 256);  // 1000 tokens in shards of 256
  ShardManifest m = ShardManifest::load(dir);
  ASSERT_EQ(m.shards.size(), 4u);
  EXPECT_EQ(m.total_tokens(), 1000u);
  EXPECT_EQ(m.total_documents(), 10u);
  EXPECT_EQ(m.shards[3].tokens, 1000u - 3 * 256);
  EXPECT_EQ(fs::file_size(fs::path(dir) / "part-00001.npy"), 256u * 4);
  auto shards = TokenShards::open(dir);
  EXPECT_NO_THROW(shards->verify());
  uint32_t first[3];
  shards->read(0, 98, 3, first);
  EXPECT_EQ(first[1], 0u);  // the EOS after the first document of 99 tokens
}

TEST(InstanceLoader, OrderIsAPureFunctionOfSeedAndIndex) {
  auto shards = TokenShards::open(make_shards("pure", 40, 127, 1000));
  InstanceLoader a(shards, 32, 7), b(shards, 32, 7), other_seed(shards, 32, 8);
  const uint64_t n = a.instances_per_epoch();
  EXPECT_EQ(n, 5u * (1000 / 32) + 120 / 32);  // 40 * 128 = 5120 tokens: 5 shards of 1000 and one of 120
  // One epoch visits every window exactly once; the next epoch in another order.
  std::set<uint64_t> windows;
  int same_as_next_epoch = 0, same_as_other_seed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    windows.insert(a.window_of(i));
    same_as_next_epoch += a.window_of(i) == a.window_of(i + n);
    same_as_other_seed += a.window_of(i) == other_seed.window_of(i);
  }
  EXPECT_EQ(windows.size(), n);
  EXPECT_LT(same_as_next_epoch, 10);
  EXPECT_LT(same_as_other_seed, 10);
  // Independent loader objects agree on every index, in any order of asking.
  for (uint64_t i : {uint64_t(0), uint64_t(5), n - 1, n, 3 * n + 17}) EXPECT_EQ(a.instance(i), b.instance(i)) << i;
}

TEST(InstanceLoader, RestartMidEpochContinuesExactly) {
  auto shards = TokenShards::open(make_shards("resume", 40, 127, 1000));
  const int64_t batch = 6;
  InstanceLoader uninterrupted(shards, 32, 3);
  std::vector<at::Tensor> expected;
  for (uint64_t step = 0; step < 40; ++step)
    expected.push_back(uninterrupted.batch(step * batch, batch));  // crosses an epoch
  // "Crash" after step 13: a new process builds a new loader and continues from the saved step.
  InstanceLoader first(shards, 32, 3);
  for (uint64_t step = 0; step < 14; ++step) EXPECT_TRUE(at::equal(first.batch(step * batch, batch), expected[step]));
  InstanceLoader resumed(shards, 32, 3);
  for (uint64_t step = 14; step < 40; ++step)
    EXPECT_TRUE(at::equal(resumed.batch(step * batch, batch), expected[step])) << step;
}

TEST(InstanceLoader, RanksSplitTheSameGlobalBatches) {
  auto shards = TokenShards::open(make_shards("ranks", 40, 127, 1000));
  InstanceLoader loader(shards, 16, 11);
  for (uint64_t step = 0; step < 5; ++step) {
    at::Tensor global = loader.rank_batch(step, 8, 0, 1);
    for (int world : {2, 4, 8}) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(loader.rank_batch(step, 8, r, world));
      EXPECT_TRUE(at::equal(at::cat(parts), global)) << "world " << world;
    }
  }
  EXPECT_THROW(loader.rank_batch(0, 8, 0, 3), Error);
}

TEST(InstanceLoader, ValidationIsSequential) {
  auto shards = TokenShards::open(make_shards("valid", 10, 99, 10000));
  InstanceLoader v(shards, 10, 0, /*shuffle=*/false);
  for (uint64_t i = 0; i < v.instances_per_epoch(); ++i) EXPECT_EQ(v.window_of(i), i);
  std::vector<uint32_t> direct(10);
  shards->read(0, 30, 10, direct.data());
  EXPECT_EQ(v.instance(3), direct);
}

TEST(ShardErrors, SizeNotAMultipleOfFour) {
  std::string dir = make_shards("mult4", 3, 10, 1000);
  std::ofstream(fs::path(dir) / "part-00000.npy", std::ios::app | std::ios::binary) << "xy";
  expect_error([&] { TokenShards::open(dir); }, {"part-00000.npy", "not a multiple of 4"});
}

TEST(ShardErrors, IdsOutsideTheVocabulary) {
  std::string dir = make_shards("vocab", 3, 10, 1000);
  {
    std::fstream f(fs::path(dir) / "part-00000.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5 * 4);
    const uint32_t bad = 5000;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  auto shards = TokenShards::open(dir);
  std::vector<uint32_t> buf(10);
  expect_error([&] { shards->read(0, 0, 10, buf.data()); },
               {"part-00000.npy", "token 5 is id 5000", "vocabulary size 1000"});
  expect_error([&] { shards->verify(); }, {"part-00000.npy", "SHA-256"});
}

TEST(ShardVerification, CachedUntilTheShardsOrManifestChange) {
  std::string dir = make_shards("verify_cache", 3, 10, 1000);
  EXPECT_TRUE(TokenShards::open(dir)->verify_cached());   // the full check runs and is recorded
  EXPECT_FALSE(TokenShards::open(dir)->verify_cached());  // unchanged: skipped
  {
    // Same size, other bytes, a later modification time: checked again, and the damage found.
    std::fstream f(fs::path(dir) / "part-00000.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * 4);
    const uint32_t other = 17;
    f.write(reinterpret_cast<const char*>(&other), 4);
  }
  fs::last_write_time(fs::path(dir) / "part-00000.npy", fs::file_time_type::clock::now() + std::chrono::seconds(5));
  expect_error([&] { TokenShards::open(dir)->verify_cached(); }, {"part-00000.npy", "SHA-256", "does not match"});
  // A manifest whose checksum was edited is a changed manifest: checked again, and refused.
  std::string dir2 = make_shards("verify_cache_manifest", 3, 10, 1000);
  EXPECT_TRUE(TokenShards::open(dir2)->verify_cached());
  auto json = ShardManifest::load(dir2).to_json();
  json["shards"][0]["sha256"] = std::string(64, 'a');
  std::ofstream(fs::path(dir2) / "manifest.json") << json.dump();
  expect_error([&] { TokenShards::open(dir2)->verify_cached(); }, {"part-00000.npy", "does not match manifest.json"});
}

TEST(ShardErrors, ManifestDoesNotMatchShards) {
  std::string dir = make_shards("manifest", 3, 10, 1000);
  auto json = ShardManifest::load(dir).to_json();
  json["shards"][0]["tokens"] = 40;
  json["total_tokens"] = 40;
  std::ofstream(fs::path(dir) / "manifest.json") << json.dump();
  expect_error([&] { TokenShards::open(dir); }, {"part-00000.npy", "holds 33 tokens", "manifest.json says 40"});

  json["shards"][0]["tokens"] = 33;
  json["total_tokens"] = 99;
  std::ofstream(fs::path(dir) / "manifest.json") << json.dump();
  expect_error([&] { TokenShards::open(dir); }, {"manifest.json", "total_tokens"});

  json["total_tokens"] = 33;
  json["shards"][0]["file"] = "part-00009.npy";
  std::ofstream(fs::path(dir) / "manifest.json") << json.dump();
  expect_error([&] { TokenShards::open(dir); }, {"manifest.json", "'part-00009.npy' is missing"});

  std::ofstream(fs::path(dir) / "manifest.json") << "{\"format\": ";
  expect_error([&] { TokenShards::open(dir); }, {"manifest.json", "malformed JSON"});
}

TEST(ShardErrors, TooFewTokensForOneInstance) {
  auto shards = TokenShards::open(make_shards("short", 1, 10, 1000));
  expect_error([&] { InstanceLoader(shards, 64, 0); }, {"no complete instance of length 64"});
}
