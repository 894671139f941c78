// Megatron indexed datasets and OLMo-core token files read in place: the same tokens written as engine
// shards, a Megatron dataset and OLMo-core files give the same instances; manifests derived without
// archspace's; and every malformed input an error naming the file and byte offset (or line).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "archspace/data/instance_loader.h"
#include "archspace/data/megatron_dataset.h"
#include "archspace/data/olmo_core_tokens.h"
#include "archspace/data/token_source.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;
namespace fs = std::filesystem;
using archspace::testing::expect_error;

namespace {

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("archspace_formats_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Documents of random length (1..max_len tokens, then EOS = 0) with ids in [1, vocab).
std::vector<std::vector<uint32_t>> documents(int n, int max_len, int64_t vocab, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint32_t>> docs(n);
  for (auto& d : docs) {
    const int len = 1 + static_cast<int>(rng() % max_len);
    for (int i = 0; i < len; ++i) d.push_back(1 + rng() % static_cast<uint32_t>(vocab - 1));
    d.push_back(0);
  }
  return docs;
}

ShardManifest test_manifest(int64_t vocab) {
  ShardManifest m;
  m.tokenizer_name = "test";
  m.tokenizer_sha256 = "0";
  m.vocab_size = vocab;
  m.eos_token_id = 0;
  return m;
}

void write_all(TokenFormat f, const std::string& out, const std::vector<std::vector<uint32_t>>& docs,
               uint64_t file_tokens, int64_t vocab) {
  auto w = make_token_writer(f, out, file_tokens, vocab);
  for (const auto& d : docs) w->add_document(d);
  w->finish(test_manifest(vocab));
}

std::vector<std::vector<uint32_t>> instances(const std::shared_ptr<TokenShards>& s, int64_t len, uint64_t seed) {
  InstanceLoader loader(s, len, seed);
  std::vector<std::vector<uint32_t>> out;
  for (uint64_t i = 0; i < 2 * loader.instances_per_epoch(); ++i) out.push_back(loader.instance(i));
  return out;
}

// An independent .idx writer, byte by byte from the published layout (see megatron_dataset.h).
struct Idx {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t code = 8;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, docs;
  int64_t sequences_override = -1, documents_override = -1;
  std::string bytes() const {
    std::string b = magic;
    auto put = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
    put(&version, 8);
    put(&code, 1);
    const uint64_t s = sequences_override >= 0 ? sequences_override : lengths.size();
    const uint64_t d = documents_override >= 0 ? documents_override : docs.size();
    put(&s, 8);
    put(&d, 8);
    for (int32_t l : lengths) put(&l, 4);
    for (int64_t p : pointers) put(&p, 8);
    for (int64_t x : docs) put(&x, 8);
    return b;
  }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A valid uint16 dataset of three documents (lengths 3, 2, 4, EOS 0 last) and its index.
Idx small_dataset(const fs::path& prefix) {
  const std::vector<uint16_t> tokens = {5, 6, 0, 7, 0, 8, 9, 10, 0};
  write_bytes(prefix.string() + ".bin", std::string(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size()));
  Idx idx;
  idx.lengths = {3, 2, 4};
  idx.pointers = {0, 6, 10};
  idx.docs = {0, 1, 2, 3};
  write_bytes(prefix.string() + ".idx", idx.bytes());
  return idx;
}

}  // namespace

TEST(TokenFormats, SameTokensGiveTheSameInstancesInEveryFormat) {
  for (int64_t vocab : {1000, 100278}) {  // uint16 files, and int32 (Megatron) / uint32 (OLMo-core)
    for (uint64_t file_tokens : {uint64_t(1) << 28, uint64_t(300)}) {
      const fs::path dir = scratch("same_" + std::to_string(vocab) + "_" + std::to_string(file_tokens));
      const auto docs = documents(120, 40, vocab);
      write_all(TokenFormat::kShards, (dir / "shards").string(), docs, file_tokens, vocab);
      write_all(TokenFormat::kOlmoCore, (dir / "olmo").string(), docs, file_tokens, vocab);
      auto shards = open_token_source((dir / "shards").string());
      auto olmo = open_token_source((dir / "olmo").string());
      EXPECT_EQ(olmo->manifest().dtype, vocab < 65536 ? TokenDtype::kUint16 : TokenDtype::kUint32);
      ASSERT_EQ(olmo->num_shards(), shards->num_shards());
      EXPECT_EQ(olmo->manifest().total_tokens(), shards->manifest().total_tokens());
      EXPECT_EQ(olmo->manifest().total_documents(), 120u);
      EXPECT_NO_THROW(olmo->verify());
      const auto want = instances(shards, 32, 5);
      EXPECT_EQ(instances(olmo, 32, 5), want);
      if (file_tokens > shards->manifest().total_tokens()) {  // Megatron: one .bin, as one shard
        write_all(TokenFormat::kMegatron, (dir / "mega" / "corpus").string(), docs, file_tokens, vocab);
        auto mega = open_token_source((dir / "mega" / "corpus").string());
        EXPECT_EQ(mega->manifest().dtype, vocab < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32);
        EXPECT_EQ(mega->manifest().total_documents(), 120u);
        EXPECT_NO_THROW(mega->verify());
        EXPECT_EQ(instances(mega, 32, 5), want);
        EXPECT_EQ(open_token_source((dir / "mega" / "corpus.idx").string())->manifest().total_tokens(),
                  shards->manifest().total_tokens());
      }
    }
  }
}

TEST(TokenFormats, ManifestsAreDerivedWhenTheFilesCarryNone) {
  const fs::path dir = scratch("derived");
  const auto docs = documents(50, 30, 1000);
  write_all(TokenFormat::kMegatron, (dir / "m").string(), docs, 0, 1000);
  write_all(TokenFormat::kOlmoCore, (dir / "o").string(), docs, 200, 1000);
  const ShardManifest mega_own = open_token_source((dir / "m").string())->manifest();
  const ShardManifest olmo_own = open_token_source((dir / "o").string())->manifest();
  fs::remove(dir / "m.manifest.json");
  fs::remove(dir / "o" / "manifest.json");

  expect_error([&] { open_token_source((dir / "m").string()); }, {"m", "vocabulary size"});
  TokenSourceOptions model;
  model.vocab_size = 1024;  // the model's (padded) vocabulary
  model.eos_token_id = 0;
  auto mega = open_token_source((dir / "m").string(), model);
  EXPECT_EQ(mega->manifest().total_tokens(), mega_own.total_tokens());
  EXPECT_EQ(mega->manifest().total_documents(), 50u);
  EXPECT_TRUE(mega->manifest().shards[0].sha256.empty());
  EXPECT_TRUE(mega->verify_cached());  // the checksums are computed, and kept in the stamp
  EXPECT_EQ(mega->manifest().shards[0].sha256, mega_own.shards[0].sha256);
  auto again = open_token_source((dir / "m").string(), model);
  EXPECT_FALSE(again->verify_cached());
  EXPECT_EQ(again->manifest().shards[0].sha256, mega_own.shards[0].sha256);

  // OLMo-core: the dtype from the vocabulary (uint16 for 1024 ids, OLMo-core's rule), counts from .csv.gz.
  auto olmo = open_token_source((dir / "o").string(), model);
  EXPECT_EQ(olmo->manifest().dtype, TokenDtype::kUint16);
  EXPECT_EQ(olmo->num_shards(), olmo_own.shards.size());
  EXPECT_EQ(olmo->manifest().total_tokens(), olmo_own.total_tokens());
  EXPECT_NO_THROW(olmo->verify());
  EXPECT_EQ(olmo->manifest().total_documents(), 50u);  // a document split over two files counts once
  for (size_t i = 0; i < olmo_own.shards.size(); ++i)
    EXPECT_EQ(olmo->manifest().shards[i].sha256, olmo_own.shards[i].sha256);
  // Without the metadata the documents are the EOS tokens.
  for (const auto& e : fs::directory_iterator(dir / "o"))
    if (e.path().string().ends_with(".csv.gz")) fs::remove(e.path());
  auto bare = open_token_source((dir / "o").string(), model);
  EXPECT_EQ(bare->manifest().total_documents(), 0u);
  bare->verify();
  EXPECT_EQ(bare->manifest().total_documents(), 50u);
  // One .npy file alone, its dtype given.
  model.dtype = TokenDtype::kUint16;
  EXPECT_EQ(open_token_source((dir / "o" / "part-00000.npy").string(), model)->num_shards(), 1u);
  model.dtype = TokenDtype::kUint32;
  expect_error([&] { open_token_source((dir / "o" / "part-00000.npy").string(), model)->verify(); },
               {"part-00000.npy"});
}

TEST(TokenFormats, MalformedMegatronIndexNamesFileAndOffset) {
  const fs::path dir = scratch("bad_idx");
  const fs::path prefix = dir / "d";
  TokenSourceOptions model;
  model.vocab_size = 100;
  model.eos_token_id = 0;
  const Idx good = small_dataset(prefix);
  EXPECT_EQ(open_token_source(prefix.string(), model)->manifest().total_documents(), 3u);
  const std::string idx = prefix.string() + ".idx";
  auto expect_bad = [&](const Idx& i, std::vector<std::string> fragments) {
    write_bytes(idx, i.bytes());
    fragments.insert(fragments.begin(), "d.idx");
    expect_error([&] { open_token_source(prefix.string(), model); }, fragments);
  };
  Idx i = good;
  i.magic = std::string("MMIDIDY\0\0", 9);
  expect_bad(i, {"byte 0", "wrong magic"});
  i = good;
  i.version = 2;
  expect_bad(i, {"byte 9", "unknown version 2"});
  i = good;
  i.code = 7;
  expect_bad(i, {"byte 17", "bad dtype code 7", "float"});
  i.code = 9;
  expect_bad(i, {"byte 17", "bad dtype code 9"});
  i = good;
  i.sequences_override = int64_t(1) << 62;  // must be refused before anything is allocated or read
  expect_bad(i, {"byte 18", "sequence count"});
  i = good;
  i.documents_override = 1000;
  expect_bad(i, {"byte 26", "document count 1000"});
  i = good;
  i.pointers[2] = 12;
  expect_bad(i, {"byte " + std::to_string(34 + 12 + 16), "sequence_pointers[2]", "pointer/length mismatch"});
  i = good;
  i.lengths[1] = -1;
  expect_bad(i, {"byte " + std::to_string(34 + 4), "sequence_lengths[1]", "negative"});
  i = good;
  i.docs = {0, 2, 1, 3};
  expect_bad(i, {"document_indices[2]"});
  i = good;
  i.docs = {0, 1, 2};
  i.documents_override = 3;
  expect_bad(i, {"last document index is 2"});
  write_bytes(idx, good.bytes() + "xyz");
  expect_error([&] { open_token_source(prefix.string(), model); }, {"d.idx", "3 bytes after the document indices"});
  write_bytes(idx, good.bytes().substr(0, 20));
  expect_error([&] { open_token_source(prefix.string(), model); }, {"d.idx", "truncated header"});

  // The .bin against its index, and its contents against the vocabulary and EOS.
  write_bytes(idx, good.bytes());
  fs::resize_file(prefix.string() + ".bin", 16);
  expect_error([&] { open_token_source(prefix.string(), model); }, {"d.bin", "16 bytes", "truncated"});
  small_dataset(prefix);
  model.vocab_size = 9;
  expect_error([&] { open_token_source(prefix.string(), model)->verify(); },
               {"d.bin", "token 6 is id 9 (byte 12)", "vocabulary size 9"});
  model.vocab_size = 100;
  model.eos_token_id = 7;
  expect_error([&] { open_token_source(prefix.string(), model)->verify(); },
               {"d.bin", "byte 4", "document 0", "does not end with EOS"});
}

TEST(TokenFormats, MalformedOlmoCoreFilesNameFileAndOffset) {
  const fs::path dir = scratch("bad_olmo");
  TokenSourceOptions model;
  model.vocab_size = 1000;
  model.eos_token_id = 0;
  const std::vector<uint16_t> tokens = {5, 6, 0, 7, 0};
  write_bytes(dir / "a.npy", std::string(reinterpret_cast<const char*>(tokens.data()), 10));
  auto csv = [&](const std::string& text) {
    gzFile f = gzopen((dir / "a.csv.gz").c_str(), "wb");
    gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
  };
  csv("0,3,doc-a,src\n3,5,doc-b,src\n");
  EXPECT_EQ(open_token_source(dir.string(), model)->manifest().total_documents(), 2u);
  csv("0,3\n3,6\n");
  expect_error([&] { open_token_source(dir.string(), model); }, {"a.csv.gz:2", "document end 6"});
  csv("0,3\n4,5\n");
  expect_error([&] { open_token_source(dir.string(), model); }, {"a.csv.gz:2", "starts at token 4"});
  csv("0,x\n");
  expect_error([&] { open_token_source(dir.string(), model); }, {"a.csv.gz:1", "start,end"});
  csv("0,2\n2,5\n");
  expect_error([&] { open_token_source(dir.string(), model)->verify(); },
               {"a.npy", "byte 2", "ending at token 2", "does not end with EOS"});
  csv("0,3\n3,5\n");
  model.vocab_size = 7;  // uint8 by OLMo-core's rule: the 10 bytes are 10 tokens, and the metadata says 5
  expect_error([&] { open_token_source(dir.string(), model); }, {"a.csv.gz", "end at token 5", "holds 10", "dtype"});
  model.dtype = TokenDtype::kUint16;
  expect_error([&] { open_token_source(dir.string(), model)->verify(); }, {"a.npy", "token 3 is id 7 (byte 6)"});
  write_bytes(dir / "a.npy", std::string(reinterpret_cast<const char*>(tokens.data()), 9));
  expect_error([&] { open_token_source(dir.string(), model); }, {"a.npy", "size 9 bytes", "not a multiple of 2"});
  expect_error([&] { open_token_source((dir / "nothing").string(), model); }, {"nothing", "not a token source"});
}
