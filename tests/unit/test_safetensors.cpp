// safetensors reading and writing, sharding, and every malformed-file error naming the file and tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "archspace/io/safetensors.h"
#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;
namespace fs = std::filesystem;

namespace {

using archspace::testing::fresh_dir;

// Writes a file with the given JSON header and `data_bytes` zero bytes of data.
void write_raw(const fs::path& path, const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

void expect_open_error(const fs::path& path, std::vector<std::string> fragments) {
  try {
    SafetensorsFile::open(path.string());
    FAIL() << "opened " << path;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

}  // namespace

TEST(Safetensors, RoundTripDtypesAndMetadata) {
  fs::path dir = fresh_dir("roundtrip");
  at::manual_seed(0);
  NamedTensors tensors = {{"a.f32", at::randn({3, 4})},
                          {"b.bf16", at::randn({5}).to(at::kBFloat16)},
                          {"c.f16", at::randn({2, 2, 2}).to(at::kHalf)},
                          {"d.scalar", at::tensor(3.5f).reshape({})},
                          {"e.i64", at::arange(7, at::kLong)}};
  save_safetensors((dir / "t.safetensors").string(), tensors, {{"format", "pt"}, {"note", "x"}});
  auto f = SafetensorsFile::open((dir / "t.safetensors").string());
  EXPECT_EQ(f->metadata().at("note"), "x");
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    at::Tensor back = f->tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
  EXPECT_EQ(f->find("b.bf16")->dtype, "BF16");
  // Views stay valid after the file object is released (they hold the mapping).
  at::Tensor view = f->tensor("a.f32");
  f.reset();
  EXPECT_TRUE(at::equal(view, tensors[0].second));
}

TEST(Safetensors, HeaderIsPaddedSoDataIsAligned) {
  fs::path dir = fresh_dir("align");
  save_safetensors((dir / "t.safetensors").string(), {{"x", at::ones({3})}});
  std::ifstream in(dir / "t.safetensors", std::ios::binary);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(in.get())) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, ShardedWriteAndRead) {
  fs::path dir = fresh_dir("sharded");
  NamedTensors tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("w" + std::to_string(i), at::full({64}, float(i)));
  save_model_weights(dir.string(), tensors, /*max_shard_bytes=*/600);  // 256 bytes each: 2 per shard
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "model-00003-of-00003.safetensors"));
  TensorStore store = TensorStore::open_dir(dir.string());
  EXPECT_EQ(store.names().size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(store.tensor(name), t)) << name;
}

TEST(SafetensorsErrors, TooShortForTheLengthField) {
  fs::path p = fresh_dir("short") / "x.safetensors";
  std::ofstream(p, std::ios::binary) << "abc";
  expect_open_error(p, {"8-byte header length"});
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  fs::path p = fresh_dir("hdrlen") / "x.safetensors";
  write_raw(p, "{}", 0, /*header_len_override=*/4096);
  expect_open_error(p, {"header length 4096", "past the end"});
}

TEST(SafetensorsErrors, MalformedHeaderJson) {
  fs::path p = fresh_dir("badjson") / "x.safetensors";
  write_raw(p, "{\"a\": {\"dtype\": ", 0);
  expect_open_error(p, {"malformed JSON header"});
}

// Found by fuzz/fuzz_shard_manifest: a number too large for a double (1e400) is nlohmann's out_of_range, not a
// parse_error, and escaped every JSON reader (safetensors header, JSON files, JSON lines).
TEST(SafetensorsErrors, NumberTooLargeInHeader) {
  fs::path p = fresh_dir("hugenumber") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})", 4);
  expect_open_error(p, {"malformed JSON header"});
}

TEST(SafetensorsErrors, ByteRangeOutOfBounds) {
  fs::path p = fresh_dir("oob") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  expect_open_error(p, {"tensor 'w'", "out of bounds", "8 bytes"});
}

TEST(SafetensorsErrors, OverlappingTensors) {
  fs::path p = fresh_dir("overlap") / "x.safetensors";
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
            24);
  expect_open_error(p, {"'b'", "overlaps", "'a'"});
}

TEST(SafetensorsErrors, ShapeDoesNotFitByteRange) {
  fs::path p = fresh_dir("shape") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 32]}})", 32);
  expect_open_error(p, {"tensor 'w'", "32 bytes", "F32 [3, 3] needs 36"});
}

// As strict as the safetensors library ("incomplete metadata, file not fully covered"): bytes inserted or
// appended would otherwise shift or hide weights silently.
TEST(SafetensorsErrors, TrailingBytesAfterTheLastTensor) {
  fs::path p = fresh_dir("trailing") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 20);
  expect_open_error(p, {"cover 16 bytes", "has 20", "trailing bytes"});
}

TEST(SafetensorsErrors, GapBetweenTensors) {
  fs::path p = fresh_dir("gap") / "x.safetensors";
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
            20);
  expect_open_error(p, {"tensor 'b' starts at byte 12", "ends at 8", "not fully covered"});
}

TEST(SafetensorsErrors, DataNotStartingAtZero) {
  fs::path p = fresh_dir("start") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  expect_open_error(p, {"tensor 'w' starts at byte 4", "ends at 0"});
}

TEST(SafetensorsErrors, NulPaddingInTheHeader) {
  fs::path p = fresh_dir("nul") / "x.safetensors";
  write_raw(p, std::string(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})") + std::string(4, '\0'),
            4);
  expect_open_error(p, {"NUL byte"});
  fs::path q = fresh_dir("space_first") / "x.safetensors";
  write_raw(q, R"( {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4);
  expect_open_error(q, {"does not start with '{'"});
}

TEST(Safetensors, SpacePaddedHeaderIsAccepted) {
  fs::path p = fresh_dir("spaces") / "x.safetensors";
  write_raw(p,
            R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})"
            "       ",
            4);
  EXPECT_EQ(SafetensorsFile::open(p.string())->tensors().size(), 1u);
}

TEST(SafetensorsErrors, UnknownDtype) {
  fs::path p = fresh_dir("dtype") / "x.safetensors";
  write_raw(p, R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", 4);
  expect_open_error(p, {"tensor 'w'", "unsupported dtype 'F8_E4M3'"});
}

TEST(SafetensorsErrors, MissingShard) {
  fs::path dir = fresh_dir("missingshard");
  NamedTensors tensors;
  for (int i = 0; i < 4; ++i) tensors.emplace_back("w" + std::to_string(i), at::zeros({64}));
  save_model_weights(dir.string(), tensors, 600);
  fs::remove(dir / "model-00002-of-00002.safetensors");
  try {
    TensorStore::open_dir(dir.string());
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shard 'model-00002-of-00002.safetensors'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
}

TEST(SafetensorsErrors, IndexPointsAtShardWithoutTheTensor) {
  fs::path dir = fresh_dir("wrongshard");
  save_safetensors((dir / "a.safetensors").string(), {{"x", at::zeros({2})}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})";
  EXPECT_THROW(
      {
        try {
          TensorStore::open_dir(dir.string());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos);
          throw;
        }
      },
      Error);
}

TEST(WeightsCheck, ListsEveryMissingUnexpectedAndMisshapedTensorAtOnce) {
  ModelConfig c = preset("tiny");
  fs::path dir = fresh_dir("strict");
  CausalLM model = CausalLM::random_init(c, 0);
  NamedTensors tensors;
  for (const auto& [name, t] : model.parameters()) {
    if (name == "model.norm.weight" || name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
    if (name == "lm_head.weight") {
      tensors.emplace_back(name, at::zeros({c.vocab_size + 1, c.hidden_size}));  // mis-shaped
      continue;
    }
    tensors.emplace_back(name, t);
  }
  tensors.emplace_back("model.layers.0.extra.weight", at::zeros({2}));  // unexpected
  save_model_weights(dir.string(), tensors);
  c.save((dir / "config.json").string());
  try {
    load_model(dir.string());
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const char* f :
         {"2 missing", "model.norm.weight", "model.layers.1.mlp.up_proj.weight", "1 unexpected",
          "model.layers.0.extra.weight", "1 mis-shaped", "lm_head.weight (file [513, 64], model [512, 64])"}) {
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    }
  }
}

TEST(WeightsCheck, IntegerWeightsAreRejected) {
  ModelConfig c = preset("tiny");
  fs::path dir = fresh_dir("intweights");
  NamedTensors tensors;
  CausalLM model = CausalLM::random_init(c, 0);
  for (const auto& [name, t] : model.parameters()) {
    tensors.emplace_back(name, name == "model.norm.weight" ? at::ones(t.sizes(), at::kInt) : t);
  }
  save_model_weights(dir.string(), tensors);
  c.save((dir / "config.json").string());
  try {
    load_model(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight (I32)"), std::string::npos) << e.what();
  }
}
