// ModelConfig: presets, JSON round trip, the published ArchSpace configs, and errors that name the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "archspace/config/model_config.h"
#include "archspace/model/causal_lm.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"
#include "archspace/util/strings.h"
#include "test_support.h"

using namespace archspace;
using nlohmann::json;

namespace {

std::string data_file(const std::string& name) { return std::string(ARCHSPACE_TEST_DATA_DIR) + "/" + name; }

json tiny_json() { return preset("tiny").to_json(); }

// Expects from_json to throw an archspace::Error whose message contains every fragment.
void expect_error(const json& j, std::vector<std::string> fragments) {
  try {
    ModelConfig::from_json(j, "some/config.json");
    FAIL() << "no error for " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("some/config.json"), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

}  // namespace

TEST(Presets, AllValidateAndMatchSpecTable) {
  for (const auto& name : preset_names()) EXPECT_NO_THROW(preset(name).validate(name)) << name;
  ModelConfig c = preset("1B");
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.vocab_size, 100278);
  EXPECT_EQ(c.padded_vocab_size, 100352);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(preset("32B").num_key_value_heads, 8);
  EXPECT_EQ(preset("3B").head_dim, 208);
  EXPECT_EQ(preset("190M").layer_types[3], LayerType::kFull);
  EXPECT_EQ(preset("190M").layer_types[2], LayerType::kSliding);
  EXPECT_THROW(preset("2B"), Error);
}

// Found by fuzz/fuzz_shard_manifest: a number too large for a double escaped JSON readers as nlohmann's
// out_of_range (std::terminate) instead of an archspace::Error naming the file or line.
TEST(Config, NumberTooLargeIsAnError) {
  const std::string path = ::testing::TempDir() + "/huge_number.config.json";
  { std::ofstream(path) << R"({"vocab_size": 1e400})"; }
  try {
    ModelConfig::load(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": malformed JSON"), std::string::npos) << e.what();
  }
  try {
    parse_json_line(R"({"messages": 1e400})", "chat.jsonl:3");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat.jsonl:3: malformed JSON line"), std::string::npos) << e.what();
  }
}

TEST(Config, JsonRoundTrip) {
  for (const auto& name : preset_names()) {
    for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
      ModelConfig c = preset(name, v);
      c.rope_scaling = YarnScaling{};
      ModelConfig back = ModelConfig::from_json(c.to_json());
      EXPECT_EQ(back.to_json(), c.to_json()) << name;
      EXPECT_EQ(back.head_dim, c.head_dim);
      EXPECT_EQ(back.variant, v);
    }
  }
}

// What a stage transition may not change: every architecture field that differs, named with both values; the
// sequence length, RoPE and token ids are not among them, and the variant's switches count only between two
// siamese_depth configs.
static std::string changed(const std::string& field, int64_t from, int64_t to) {
  return field + " " + std::to_string(from) + " -> " + std::to_string(to);
}

TEST(Config, ArchitectureDifferencesNameEachFieldWithBothValues) {
  const ModelConfig tiny = preset("tiny");
  EXPECT_TRUE(tiny.architecture_differences(tiny).empty());
  ModelConfig longer = tiny;
  longer.max_position_embeddings *= 2;
  longer.rope_scaling = YarnScaling{};
  longer.eos_token_id = 7;
  EXPECT_TRUE(tiny.architecture_differences(longer).empty());
  ModelConfig wider = tiny;
  wider.hidden_size *= 2;
  wider.vocab_size += 1;
  EXPECT_EQ(tiny.architecture_differences(wider),
            (std::vector<std::string>{changed("hidden_size", tiny.hidden_size, wider.hidden_size),
                                      changed("vocab_size", tiny.vocab_size, wider.vocab_size)}));
  const ModelConfig siamese = preset("tiny", Variant::kSiameseDepth);
  EXPECT_EQ(tiny.architecture_differences(siamese),
            (std::vector<std::string>{std::string("variant base -> siamese_depth")}));
  ModelConfig strided = siamese;
  strided.depth_attention_stride += 1;
  EXPECT_EQ(siamese.architecture_differences(strided),
            (std::vector<std::string>{
                changed("depth_attention_stride", siamese.depth_attention_stride, strided.depth_attention_stride)}));
}

TEST(Config, LoadsPublishedArchSpaceConfigs) {
  ModelConfig s2 = ModelConfig::load(data_file("archspace-1b-siamese-depth-stage2.config.json"));
  EXPECT_EQ(s2.variant, Variant::kSiameseDepth);
  EXPECT_EQ(s2.head_dim, 128);
  EXPECT_FALSE(s2.rope_scaling.has_value());
  EXPECT_TRUE(s2.use_siamese_norm && s2.use_depth_attention);
  EXPECT_EQ(s2.depth_attention_stride, 8);
  ModelConfig s4 = ModelConfig::load(data_file("archspace-1b-siamese-depth-stage4.config.json"));
  ASSERT_TRUE(s4.rope_scaling.has_value());
  EXPECT_EQ(s4.rope_scaling->factor, 8.0);
  EXPECT_EQ(s4.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(s4.max_position_embeddings, 65536);
  EXPECT_EQ(s4.eos_token_id, 100257);
}

TEST(Config, TransformersFiveRopeParameters) {
  json j = tiny_json();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
      {"full_attention",
       {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 128}}}};
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.rope_theta, 10000.0);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 4.0);
  // YaRN on sliding layers is refused (SPEC.md section 1).
  j["rope_parameters"]["sliding_attention"] = j["rope_parameters"]["full_attention"];
  expect_error(j, {"rope_parameters.sliding_attention", "plain"});
}

TEST(ConfigErrors, MalformedJsonNamesTheFile) {
  const auto path = std::filesystem::temp_directory_path() / "archspace_bad_config.json";
  std::ofstream(path) << "{\"model_type\": \"olmo3\", \"hidden_size\": 64,";
  try {
    ModelConfig::load(path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos);
  }
}

TEST(ConfigErrors, MissingFields) {
  for (const char* field : {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                            "intermediate_size", "rms_norm_eps", "rope_theta", "model_type"}) {
    json j = tiny_json();
    j.erase(field);
    expect_error(j, {std::string("'") + field + "'", "missing"});
  }
}

TEST(ConfigErrors, InconsistentDimensions) {
  json j = tiny_json();
  j["num_key_value_heads"] = 3;
  expect_error(j, {"'num_key_value_heads'", "does not divide"});

  j = tiny_json();
  j.erase("head_dim");
  j["hidden_size"] = 66;
  expect_error(j, {"'num_attention_heads'", "does not divide hidden_size 66"});

  j = tiny_json();
  j["layer_types"].push_back("full_attention");
  expect_error(j, {"'layer_types'", "5 entries", "num_hidden_layers is 4"});

  j = tiny_json();
  j["layer_types"][1] = "local_attention";
  expect_error(j, {"'layer_types[1]'", "local_attention"});

  j = tiny_json();
  j["head_dim"] = 15;
  expect_error(j, {"'head_dim'", "even"});

  j = tiny_json();
  j["hidden_size"] = "64";
  expect_error(j, {"'hidden_size'", "integer"});

  j = tiny_json();
  j["sliding_window"] = 0;
  expect_error(j, {"'sliding_window'", "positive"});
}

TEST(ConfigErrors, UnsupportedFeatures) {
  json j = tiny_json();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  expect_error(j, {"'rope_scaling.rope_type'", "dynamic"});

  j = tiny_json();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  expect_error(j, {"'rope_scaling.original_max_position_embeddings'", "missing"});

  j = tiny_json();
  j["model_type"] = "llama";
  expect_error(j, {"'model_type'", "llama"});

  j = tiny_json();
  j["attention_bias"] = true;
  expect_error(j, {"'attention_bias'"});

  j = tiny_json();
  j["tie_word_embeddings"] = true;
  expect_error(j, {"'tie_word_embeddings'"});
}

TEST(ParameterCount, Base190MPreset) {
  // Hand count: embeddings + head 2*V*d; per layer 4 d^2 (MHA) + 3 d*mlp + q/k norms 2d + 2 post norms 2d.
  const int64_t V = 100278, d = 768, mlp = 3072, L = 12;
  const int64_t expected = 2 * V * d + L * (4 * d * d + 3 * d * mlp + 4 * d) + d;
  EXPECT_EQ(parameter_count(preset("190M")), expected);
}

// The list parser behind "a,b,c" keys and flags and PATH-like "dir:dir" variables.
TEST(Strings, SplitNonemptyDropsEmptyParts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_nonempty("hellaswag,winogrande", ','), (V{"hellaswag", "winogrande"}));
  EXPECT_EQ(split_nonempty(",a,,b,", ','), (V{"a", "b"}));
  EXPECT_EQ(split_nonempty("/x/tasks:/y/tasks", ':'), (V{"/x/tasks", "/y/tasks"}));
  EXPECT_EQ(split_nonempty("", ','), V{});
  EXPECT_EQ(split_nonempty(",,", ','), V{});
  EXPECT_EQ(split_nonempty("single", ','), V{"single"});
}

// Nesting deeper than kMaxJsonDepth is refused before nlohmann parses (its values copy and dump recursively:
// 100,000 levels overflowed the stack); brackets inside strings do not count.
TEST(JsonDepth, DeepNestingIsAnErrorNamingTheFileBeforeAnyParse) {
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(check_json_depth(nested(kMaxJsonDepth), "x"));
  EXPECT_NO_THROW(check_json_depth("[\"" + std::string(100000, '[') + "\\\"[\"]", "x"));
  archspace::testing::expect_error([&] { check_json_depth(nested(kMaxJsonDepth + 1), "x.json"); },
                                   {"x.json", "nested deeper than 256 levels", "at byte 256"});
  archspace::testing::expect_error([&] { parse_json_text("{\"a\": " + nested(100000) + "}", "config.json"); },
                                   {"config.json", "nested deeper"});
  archspace::testing::expect_error([&] { parse_json_line(nested(100000), "prompts.jsonl:3"); },
                                   {"prompts.jsonl:3", "nested deeper"});
  const auto dir = archspace::testing::fresh_dir("json_depth");
  std::ofstream((dir / "config.json").string()) << "{\"x\": " << nested(100000) << "}";
  archspace::testing::expect_error([&] { read_json_file((dir / "config.json").string()); },
                                   {"config.json", "nested deeper"});
  std::filesystem::remove_all(dir);
}
