// The pieces of training, each alone: TrainConfig (typed choices, --set overrides, the {variant}
// placeholder), batches and their labels, the loss, clipping, the lr schedule, the autocast guard, the
// metrics log on resume and its trackers (the fan-out, TensorBoard framing), and the tokenizer a run's checkpoints
// carry.
#include <ATen/Version.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "archspace/config/train_config.h"
#include "archspace/data/instance_loader.h"
#include "archspace/kernels/adamw.h"
#include "archspace/kernels/gradient_norm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"
#include "archspace/train/batches.h"
#include "archspace/train/lr_schedule.h"
#include "archspace/train/metrics_log.h"
#include "archspace/train/optimizer.h"
#include "archspace/train/run_tokenizer.h"
#include "archspace/train/sweep.h"
#include "archspace/train/tensorboard_events.h"
#include "archspace/train/trackers.h"
#include "archspace/util/error.h"
#include "archspace/util/sha256.h"
#include "test_support.h"
#include "tolerance.h"

using namespace archspace;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using archspace::testing::expect_error;

// A minimal valid run TOML in `dir` (data.train is the directory itself: it only has to exist here).
std::string run_toml(const fs::path& dir, const std::string& extra = "") {
  const fs::path path = dir / "run.toml";
  write_file(path, "[model]\npreset = \"tiny\"\n" + extra + "\n[data]\ntrain = \"" + dir.string() +
                       "\"\n\n[train]\nrun_dir = \"runs/{variant}/stage1\"\nsequence_length = 16\nmax_steps = 10\n");
  return path.string();
}

std::string make_shards(const fs::path& dir, const std::string& tokenizer_name, const std::string& tokenizer_sha256) {
  ShardWriter w(dir.string(), 1000);
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 40; ++i) ids.push_back(1 + i % 9);
  ids.push_back(0);
  w.add_document(ids);
  ShardManifest m;
  m.tokenizer_name = tokenizer_name;
  m.tokenizer_sha256 = tokenizer_sha256;
  m.vocab_size = 10;
  m.eos_token_id = 0;
  w.finish(m);
  return dir.string();
}

}  // namespace

// ---- TrainConfig -----------------------------------------------------------------------------------

TEST(TrainConfig, ChoicesAreTyped) {
  const fs::path dir = archspace::testing::fresh_dir("typed");
  TrainConfig c = TrainConfig::load(run_toml(dir, "variant = \"siamese_depth\"\n[optim]\nlr = 1e-3\n"));
  EXPECT_EQ(c.variant, Variant::kSiameseDepth);
  EXPECT_EQ(c.format, DataFormat::kTokens);
  EXPECT_EQ(c.dtype, DType::kFp32);
  EXPECT_EQ(c.device.kind, DeviceKind::kCpu);
  // A bad choice names the file and key and lists the valid spellings.
  const std::string bad = run_toml(dir);
  write_file(bad, read_file(bad) + "dtype = \"fp16\"\n");  // the last table of the file is [train]
  expect_error([&] { TrainConfig::load(bad); }, {"run.toml: key 'train.dtype'", "'fp16'", "fp32, bf16"});
}

TEST(TrainConfig, VariantSwitchesNeedTheVariant) {
  const fs::path dir = archspace::testing::fresh_dir("switches");
  TrainConfig on = TrainConfig::load(
      run_toml(dir, "variant = \"siamese_depth\"\nuse_depth_attention = false\ndepth_attention_stride = 4\n"));
  const ModelConfig m = on.model();
  EXPECT_FALSE(m.use_depth_attention);
  EXPECT_TRUE(m.use_siamese_norm);
  EXPECT_EQ(m.depth_attention_stride, 4);
  TrainConfig off = TrainConfig::load(run_toml(dir, "use_siamese_norm = false\n"));
  expect_error([&] { off.model(); }, {"run.toml", "model.use_siamese_norm", "siamese_depth variant"});
}

TEST(TrainConfig, OverridesSetKeysWithTheirTypes) {
  const fs::path dir = archspace::testing::fresh_dir("overrides");
  const std::string path = run_toml(dir);
  TrainConfig c =
      TrainConfig::load(path, {"train.max_steps=100", "optim.lr=3e-4", "optim.warmup_steps=5", "data.shuffle=false",
                               "model.variant=siamese_depth", "train.dtype=bf16", "eval.interval=7"});
  EXPECT_EQ(c.max_steps, 100);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.warmup_steps, 5);
  EXPECT_FALSE(c.shuffle);
  EXPECT_EQ(c.variant, Variant::kSiameseDepth);
  EXPECT_EQ(c.dtype, DType::kBf16);
  EXPECT_EQ(c.eval_interval, 7);                      // a section the file lacks
  EXPECT_EQ(c.run_dir, "runs/siamese_depth/stage1");  // {variant} after the override
  // An integer is a number too; a later override of the same key wins.
  TrainConfig d = TrainConfig::load(path, {"optim.lr=1", "train.max_steps=3", "train.max_steps=4"});
  EXPECT_DOUBLE_EQ(d.lr, 1.0);
  EXPECT_EQ(d.max_steps, 4);
  // The overrides run through the same validation as the file.
  // ... and a bad value is blamed on the override that gave it, not on the file.
  expect_error([&] { TrainConfig::load(path, {"train.max_steps=0"}); },
               {"--set train.max_steps=0 (on ", "run.toml): key 'train.max_steps'", ">= 1"});
  expect_error([&] { TrainConfig::load(path, {"model.variant=big"}); },
               {"key 'model.variant'", "'big'", "base, siamese_depth"});
}

TEST(TrainConfig, AnOverrideThatConflictsWithTheFileIsNamedWithBothValuesAndTheFix) {
  const fs::path dir = archspace::testing::fresh_dir("override_conflict");
  const std::string path = run_toml(dir, "[optim]\nwarmup_steps = 20\n");
  // The file alone is wrong (20 > its max_steps 10): the file is blamed, with both values and the fix.
  try {
    TrainConfig::load(path);
    FAIL() << "no error";
  } catch (const archspace::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("--set"), std::string::npos) << m;
    for (const char* part :
         {"run.toml: key 'optim.warmup_steps'", "optim.warmup_steps = 20", "train.max_steps = 10", "at least 20"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  // With a max_steps the warmup fits, lowering it by --set is the override's fault, named first.
  const std::string fits = run_toml(dir, "[optim]\nwarmup_steps = 8\n");
  expect_error([&] { TrainConfig::load(fits, {"train.max_steps=5"}); },
               {"--set train.max_steps=5 conflicts with ", "run.toml's optim.warmup_steps = 8", "train.max_steps = 5",
                "--set optim.warmup_steps=0 (any value <= 5) as well", "train.max_steps of at least 8"});
  // Both keys overridden: both overrides are named.
  expect_error([&] { TrainConfig::load(fits, {"optim.warmup_steps=30"}); },
               {"--set optim.warmup_steps=30 conflicts with ", "run.toml's train.max_steps = 10",
                "give optim.warmup_steps at most 10, or --set train.max_steps=30 (or more)"});
  // The suggested fix works.
  EXPECT_EQ(TrainConfig::load(fits, {"train.max_steps=5", "optim.warmup_steps=0"}).max_steps, 5);
}

TEST(TrainConfig, DownstreamKeysFromTheFileAndOverrides) {
  const fs::path dir = archspace::testing::fresh_dir("downstream_keys");
  const std::string path = run_toml(dir);
  write_file(path, read_file(path) + "\n[eval]\ndownstream = [\"arc_easy\", \"piqa\"]\ndownstream_limit = 5\n");
  TrainConfig c = TrainConfig::load(path);
  EXPECT_EQ(c.downstream, (std::vector<std::string>{"arc_easy", "piqa"}));
  EXPECT_EQ(c.downstream_limit, 5);
  EXPECT_EQ(c.downstream_format, "rc");
  EXPECT_FALSE(c.downstream_shots.has_value());
  // A list override is comma-separated.
  TrainConfig d = TrainConfig::load(path, {"eval.downstream=hellaswag,winogrande,basic_arithmetic",
                                           "eval.downstream_shots=0", "eval.downstream_format=mc"});
  EXPECT_EQ(d.downstream, (std::vector<std::string>{"hellaswag", "winogrande", "basic_arithmetic"}));
  EXPECT_EQ(d.downstream_shots, 0);
  EXPECT_EQ(d.downstream_format, "mc");
  expect_error([&] { TrainConfig::load(path, {"eval.downstream_format=gen"}); },
               {"key 'eval.downstream_format'", "rc or mc"});
}

TEST(TrainConfig, BadOverridesAreRefused) {
  const fs::path dir = archspace::testing::fresh_dir("bad_overrides");
  const std::string path = run_toml(dir);
  expect_error(
      [&] { TrainConfig::load(path, {"optim.learning_rate=0.1"}); },
      {"run.toml: override 'optim.learning_rate=0.1'", "unknown key 'optim.learning_rate'", "lr", "warmup_steps"});
  expect_error([&] { TrainConfig::load(path, {"optimizer.lr=0.1"}); },
               {"unknown section 'optimizer'", "optim", "checkpoint"});
  expect_error([&] { TrainConfig::load(path, {"train.max_steps=ten"}); },
               {"override 'train.max_steps=ten'", "expects an integer"});
  expect_error([&] { TrainConfig::load(path, {"train.max_steps=1.5"}); }, {"expects an integer"});
  expect_error([&] { TrainConfig::load(path, {"optim.lr=fast"}); }, {"override 'optim.lr=fast'", "expects a number"});
  expect_error([&] { TrainConfig::load(path, {"data.shuffle=yes"}); },
               {"override 'data.shuffle=yes'", "expects true or false"});
  expect_error([&] { TrainConfig::load(path, {"a=b"}); }, {"override 'a=b'", "expected section.key=value"});
  expect_error([&] { TrainConfig::load(path, {"train.max_steps"}); }, {"expected section.key=value"});
  expect_error([&] { TrainConfig::load(path, {".x=1"}); }, {"expected section.key=value"});
  expect_error([&] { TrainConfig::load(path, {"model.rope_scaling=4"}); }, {"'model.rope_scaling' is a table"});
}

TEST(TrainConfig, TextIsTheConfigurationAsRun) {
  const fs::path dir = archspace::testing::fresh_dir("text");
  const std::string path = run_toml(dir);
  // No placeholder, no override: the file's own bytes.
  const std::string plain = (dir / "plain.toml").string();
  write_file(plain, "[model]\npreset = \"tiny\"\n[data]\ntrain = \"" + dir.string() +
                        "\"\n[train]\nrun_dir = \"r\"\nsequence_length = 4\nmax_steps = 1\n");
  EXPECT_EQ(TrainConfig::load(plain).text, read_file(plain));
  // Otherwise the resolved table, which reads back to the same configuration.
  const TrainConfig c = TrainConfig::load(path, {"train.max_steps=12"});
  EXPECT_NE(c.text.find("--set train.max_steps=12"), std::string::npos) << c.text;
  const std::string again = (dir / "again.toml").string();
  write_file(again, c.text);
  const TrainConfig d = TrainConfig::load(again);
  EXPECT_EQ(d.max_steps, 12);
  EXPECT_EQ(d.run_dir, "runs/base/stage1");
}

// ---- batches and loss ------------------------------------------------------------------------------

TEST(Batches, WindowLabelsAreTheNextTokens) {
  const fs::path dir = archspace::testing::fresh_dir("windows");
  auto shards = TokenShards::open(make_shards(dir / "shards", "test", "0"));
  InstanceLoader loader(shards, 8, 0, false);
  const Batch b = window_batch(loader, 0, 2);
  ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_TRUE(at::equal(b.labels.narrow(1, 0, 7), b.input_ids.narrow(1, 1, 7)));
  EXPECT_TRUE((b.labels.select(1, 7) == kIgnoreIndex).all().item<bool>());
  EXPECT_EQ(labelled_tokens(b), 2 * 7);
  EXPECT_EQ(batch_hash(b.input_ids), batch_hash(window_batch(loader, 0, 2).input_ids));
  EXPECT_NE(batch_hash(b.input_ids), batch_hash(window_batch(loader, 1, 2).input_ids));
}

TEST(Batches, ChatLabelsOnlyTrainedTokensPaddedAndCut) {
  // Example 0: ids 10..14, trained on the last two; example 1: 8 ids, all trained, cut to 6.
  ChatExample a{{10, 11, 12, 13, 14}, {0, 0, 0, 1, 1}}, b{{20, 21, 22, 23, 24, 25, 26, 27}, {1, 1, 1, 1, 1, 1, 1, 1}};
  ChatBatches batches({a, b}, 6, /*pad_id=*/99, /*seed=*/0, /*shuffle=*/false);
  const Batch batch = batches.batch(0, 2);
  auto ids = batch.input_ids.accessor<int64_t, 2>(), labels = batch.labels.accessor<int64_t, 2>();
  const std::vector<int64_t> ids0 = {10, 11, 12, 13, 14, 99}, labels0 = {-100, -100, 13, 14, -100, -100};
  const std::vector<int64_t> ids1 = {20, 21, 22, 23, 24, 25}, labels1 = {21, 22, 23, 24, 25, -100};
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(ids[0][t], ids0[t]);
    EXPECT_EQ(labels[0][t], labels0[t]) << t;
    EXPECT_EQ(ids[1][t], ids1[t]);
    EXPECT_EQ(labels[1][t], labels1[t]) << t;
  }
  EXPECT_EQ(labelled_tokens(batch), 2 + 5);
  // Instance k of epoch 1 is example k % 2 again (unshuffled).
  EXPECT_TRUE(at::equal(batches.batch(2, 2).input_ids, batch.input_ids));
}

TEST(Loss, SumsEqualCrossEntropyOverLabelledPositions) {
  at::manual_seed(0);
  const at::Tensor logits = at::randn({2, 5, 11});
  const at::Tensor labels = at::tensor({3, 1, -100, 7, 0, -100, -100, 10, 2, 5}, at::kLong).view({2, 5});
  const LossSums s = next_token_loss(logits, labels, 1e-4);
  const at::Tensor flat = logits.view({-1, 11}), target = labels.view({-1});
  const double ce = at::cross_entropy_loss(flat, target, {}, at::Reduction::Sum, -100).item<double>();
  const at::Tensor lse = at::logsumexp(flat, -1).masked_select(target != -100);
  EXPECT_EQ(s.count, 7);
  // Two fp32 computations from the same logits: each of the 7 log-probabilities within logprob_bound, then
  // their sum; each log-sum-exp within gamma(V + 2) + 2 u |lse|, its square and the sum of 7 squares.
  const double lse_max = tolerance::magnitude(lse), lp_max = tolerance::magnitude(at::log_softmax(flat, -1));
  EXPECT_NEAR(s.ce_sum.item<double>(), ce, 7 * tolerance::logprob_bound(0, 11, lp_max) + 2 * tolerance::gamma(7) * ce);
  const double z = 1e-4 * lse.pow(2).sum().item<double>();
  const double lse_error = tolerance::gamma(11 + 2) + 2 * tolerance::kFp32Unit * lse_max;
  EXPECT_NEAR(s.z_sum.item<double>(), z,
              2 * (1e-4 * 7 * 2 * lse_max * lse_error + (tolerance::gamma(7) + 2 * tolerance::kFp32Unit) * z));
}

// ---- optimizer side --------------------------------------------------------------------------------

// Clipping: tests/unit/test_gradient_norm.cpp.

TEST(Schedule, WarmupThenCosineToTheFinalFactor) {
  const double lr = 1e-3;
  EXPECT_DOUBLE_EQ(scheduled_lr(0, 12, 2, lr, 0.1), lr / 2);  // step 0 of a 2-step warm-up
  EXPECT_DOUBLE_EQ(scheduled_lr(1, 12, 2, lr, 0.1), lr);
  EXPECT_DOUBLE_EQ(scheduled_lr(2, 12, 2, lr, 0.1), lr);           // the cosine starts at the peak
  EXPECT_NEAR(scheduled_lr(11, 12, 2, lr, 0.1), 0.1 * lr, 1e-18);  // and ends at factor x lr on the last step
  // Half-way through the decay (progress 0.5): the mean of peak and floor.
  EXPECT_NEAR(scheduled_lr(7, 13, 2, lr, 0.1), lr * (0.1 + 0.9 * 0.5), 1e-15);
  for (int64_t s = 3; s < 12; ++s) EXPECT_LT(scheduled_lr(s, 12, 2, lr, 0.1), scheduled_lr(s - 1, 12, 2, lr, 0.1));
}

TEST(Autocast, GuardEnablesForItsScopeOnly) {
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  {
    AutocastGuard off(false);
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  }
  {
    AutocastGuard on(true);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCUDA));
    EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCUDA), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  try {  // also when the forward throws
    AutocastGuard on(true);
    throw Error("forward failed");
  } catch (const Error&) {
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
}

// ---- metrics log -----------------------------------------------------------------------------------

TEST(MetricsLog, ResumeKeepsEachStepOnce) {
  const fs::path dir = archspace::testing::fresh_dir("metrics");
  const fs::path path = dir / "metrics.jsonl";
  write_file(path,
             "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.9}\n{\"step\":2,\"valid_loss\":3.1}\n{\"step\":3,"
             "\"loss\":2.8}\n{\"step\":4,\"lo");
  {
    MetricsLog log(path.string(), 2);  // resumed from the checkpoint of step 2: steps 3 and the torn line go
    EXPECT_EQ(read_file(path),
              "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.9}\n{\"step\":2,\"valid_loss\":3.1}\n");
    log.write({{"step", 3}, {"loss", 2.75}});
    EXPECT_EQ(read_file(path),
              "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.9}\n{\"step\":2,\"valid_loss\":3.1}\n{\"loss\":2.75,"
              "\"step\":3}\n");
  }
  MetricsLog fresh(path.string(), 0);  // a run starting over keeps nothing
  EXPECT_EQ(read_file(path), "");
  MetricsLog missing((dir / "new.jsonl").string(), 0);
  EXPECT_TRUE(fs::exists(dir / "new.jsonl"));
}

// ---- trackers --------------------------------------------------------------------------------------

namespace {

// Fails at its `fail_at`-th write (or finish, for 0), recording what it got before.
class FailingTracker : public Tracker {
 public:
  FailingTracker(int fail_at, std::vector<json>* got) : fail_at_(fail_at), got_(got) {}
  std::string name() const override { return "Failing"; }
  void write(const json& record) override {
    if (++writes_ == fail_at_) throw Error("disk full");
    got_->push_back(record);
  }
  void finish() override {
    if (fail_at_ == 0) throw Error("could not close");
  }

 private:
  int fail_at_, writes_ = 0;
  std::vector<json>* got_;
};

}  // namespace

TEST(Trackers, AFailingTrackerIsWarnedAboutOnceAndTheLogGoesOn) {
  const fs::path dir = archspace::testing::fresh_dir("trackers");
  std::vector<json> failing, healthy;
  std::vector<std::unique_ptr<Tracker>> sinks;
  sinks.push_back(std::make_unique<FailingTracker>(2, &failing));
  sinks.push_back(std::make_unique<FailingTracker>(-1, &healthy));
  std::vector<std::string> warnings;
  {
    MetricsLog log((dir / "metrics.jsonl").string(), 0, std::move(sinks),
                   [&](const std::string& m) { warnings.push_back(m); });
    for (int step = 1; step <= 4; ++step) log.write({{"step", step}, {"loss", 1.0 / step}});
    log.finish();
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("Failing tracking stopped: disk full"), std::string::npos) << warnings[0];
  EXPECT_EQ(failing.size(), 1u);  // dropped at its failure: no more writes
  EXPECT_EQ(healthy.size(), 4u);  // the others go on
  const std::string lines = read_file(dir / "metrics.jsonl");
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 4);  // metrics.jsonl has every line
}

TEST(Trackers, AFinishThatFailsIsAWarning) {
  const fs::path dir = archspace::testing::fresh_dir("trackers_finish");
  std::vector<json> got;
  std::vector<std::unique_ptr<Tracker>> sinks;
  sinks.push_back(std::make_unique<FailingTracker>(0, &got));
  std::vector<std::string> warnings;
  MetricsLog log((dir / "metrics.jsonl").string(), 0, std::move(sinks),
                 [&](const std::string& m) { warnings.push_back(m); });
  log.write({{"step", 1}, {"loss", 2.0}});
  log.finish();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("could not close"), std::string::npos);
}

TEST(Trackers, FlattenRecordJoinsNestedKeys) {
  const json record = json::parse(
      R"({"step": 3, "loss": 2.5, "downstream": {"arc": {"value": 0.5, "stderr": null, "metric": "acc"}},
          "grad_norms": {"layers.0": 0.1}, "list": [4, 5]})");
  EXPECT_EQ(flatten_record(record),
            json::parse(R"({"loss": 2.5, "downstream/arc/value": 0.5, "downstream/arc/metric": "acc",
                            "grad_norms/layers.0": 0.1, "list/0": 4, "list/1": 5})"));
}

TEST(TensorBoardEvents, Crc32cOfTheCheckString) {
  // The CRC catalogue's check value of CRC-32C (iSCSI, RFC 3720): the CRC of the ASCII digits 1 to 9.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoardEvents, ADirectoryThatIsAFileIsAnErrorNamingIt) {
  const fs::path dir = archspace::testing::fresh_dir("tb_file");
  write_file(dir / "tb", "x");
  expect_error([&] { TensorBoardWriter w((dir / "tb").string(), 0); }, {(dir / "tb").string()});
}

// ---- the tokenizer checkpoints carry ---------------------------------------------------------------

TEST(RunTokenizer, ShardDirectoryTokenizerMustMatchTheManifest) {
  const fs::path dir = archspace::testing::fresh_dir("run_tokenizer");
  const std::string text = "{\"model\": {\"type\": \"BPE\"}}";
  const std::string good = make_shards(dir / "good", "mine", sha256_bytes(text.data(), text.size()));
  write_file(dir / "good" / "tokenizer.json", text);
  const ShardManifest m = ShardManifest::load(good);
  EXPECT_EQ(shard_tokenizer(good, m).file, (dir / "good" / "tokenizer.json").string());
  EXPECT_TRUE(TokenShards::open(good)->num_shards() == 1);  // readers ignore the file

  write_file(dir / "good" / "tokenizer.json", text + " ");
  expect_error([&] { shard_tokenizer(good, m); }, {"good/tokenizer.json", "does not match", "tokenizer_sha256"});

  const std::string old = make_shards(dir / "old", "synthetic", "0");  // no tokenizer.json, not dolma2
  const RunTokenizer none = shard_tokenizer(old, ShardManifest::load(old));
  EXPECT_EQ(none.file, "");
  EXPECT_NE(none.note.find("checkpoints will carry no tokenizer"), std::string::npos) << none.note;
  EXPECT_NE(none.note.find("synthetic"), std::string::npos) << none.note;
}

// ---- fused AdamW -----------------------------------------------------------------------------------

namespace {

AdamW adamw_of(const std::vector<at::Tensor>& init, bool fused) {
  std::vector<AdamW::Group> groups;
  for (size_t i = 0; i < init.size(); ++i)
    groups.push_back({std::string("p").append(std::to_string(i)), init[i].clone().requires_grad_(true),
                      /*decay=*/i != 1});
  return AdamW(groups, {0.9, 0.95, 1e-8, fused});
}

// Runs `steps` updates of both optimizers on the same gradients; returns the largest |difference| of
// the weights and of the moments.
std::pair<double, double> fused_against_loop(AdamW& loop, AdamW& fused, int steps) {
  at::manual_seed(7);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < loop.groups().size(); ++i) {
      const at::Tensor g = at::randn(loop.groups()[i].param.sizes());
      at::Tensor a = loop.groups()[i].param, b = fused.groups()[i].param;
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.clone();
    }
    const double lr = 1e-2 * (1.0 - 0.03 * s);  // a schedule: lr changes every step
    loop.step(lr, 0.1);
    fused.step(lr, 0.1);
  }
  double weights = 0, moments = 0;
  for (size_t i = 0; i < loop.groups().size(); ++i) {
    weights = std::max(weights, (loop.groups()[i].param - fused.groups()[i].param).abs().max().item<double>());
    auto [m1, v1] = loop.moments(i);
    auto [m2, v2] = fused.moments(i);
    if (!m1.defined()) continue;
    moments = std::max(moments, (m1 - m2).abs().max().item<double>());
    moments = std::max(moments, (v1 - v2).abs().max().item<double>());
  }
  return {weights, moments};
}

}  // namespace

// LibTorch 2.11 has the fused kernel for the CPU as well, so the CPU tests check it against the
// per-tensor loop (torch.optim.AdamW's single-tensor arithmetic). Same formula, other evaluation order:
// the weights (of order 1, lr 1e-2, 20 steps, weight decay on two of three tensors) may differ by fp32
// rounding, a few units of 1.2e-7 (ulp at 1) per step at most; seen with LibTorch 2.11: weights 2.4e-7,
// moments 6e-8 after 20 steps. The bound, 2e-6 absolute, is ~16 ulps: far below a wrong decay
// (lr * wd * |p| = 1e-3 per step), a wrong bias correction or lr (>= 1e-4).
TEST(AdamW, FusedEqualsThePerTensorLoop) {
  ASSERT_TRUE(fused_adamw_available(at::kCPU));
  at::manual_seed(0);
  const std::vector<at::Tensor> init = {at::randn({64, 32}), at::randn({32}), at::randn({7, 5, 3})};
  AdamW loop = adamw_of(init, false), fused = adamw_of(init, true);
  const auto [weights, moments] = fused_against_loop(loop, fused, 20);
  std::printf("fused vs loop after 20 steps: weights %.3g, moments %.3g\n", weights, moments);
  EXPECT_LE(weights, 2e-6);
  EXPECT_LE(moments, 1e-6);
  EXPECT_EQ(fused.steps_taken(), 20);
  // Not trivially equal: the undecayed tensor moved, and decay was applied to the others.
  EXPECT_GT((fused.groups()[1].param - init[1]).abs().max().item<double>(), 1e-2);
}

// ZeRO-1: each rank updates only the parameters it owns; the fused path must leave the others alone.
TEST(AdamW, FusedUpdatesOnlyOwnedParameters) {
  at::manual_seed(1);
  const std::vector<at::Tensor> init = {at::randn({16, 8}), at::randn({8}), at::randn({4, 4})};
  AdamW loop = adamw_of(init, false), fused = adamw_of(init, true);
  loop.shard({true, false, true});
  fused.shard({true, false, true});
  const auto [weights, moments] = fused_against_loop(loop, fused, 5);
  EXPECT_LE(weights, 2e-6);
  EXPECT_LE(moments, 1e-6);
  EXPECT_TRUE(at::equal(fused.groups()[1].param, init[1]));
}

// ---- the one-pass AdamW kernel (kernels/adamw.h) ------------------------------------------------

namespace {

struct KernelState {
  at::Tensor p, g, m, v, low;
};

KernelState kernel_state(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  return {at::randn({n}), at::randn({n}), at::randn({n}) * 0.1, at::rand({n}) * 0.01, at::empty({n}, at::kBFloat16)};
}

}  // namespace

// The AVX2 and scalar paths perform the same IEEE operations in the same order: equal bit for bit, tails
// (n not a multiple of 8, or of a thread's share) included; the copy is the updated weight rounded as
// at::BFloat16(float) rounds it (to nearest even).
TEST(AdamWKernel, PathsAgreeBitForBitAndTheCopyIsTheRoundedWeight) {
  const AdamWScalars s = adamw_scalars(1e-2, 0.1, 0.9, 0.95, 1e-8, /*step=*/3, /*grad_scale=*/0.37f);
  for (int64_t n : {1, 7, 8, 9, 1000, 70001}) {
    KernelState a = kernel_state(n, 11), b = kernel_state(n, 11);
    adamw_update(a.p, a.g, a.m, a.v, a.low, s, CpuIsa::kScalar);
    adamw_update(b.p, b.g, b.m, b.v, b.low, s, max_cpu_isa());
    for (auto [x, y] : {std::pair{a.p, b.p}, {a.m, b.m}, {a.v, b.v}, {a.low, b.low}})
      EXPECT_TRUE(at::equal(x, y)) << "n=" << n << ", isa " << cpu_isa_name(max_cpu_isa());
    EXPECT_TRUE(at::equal(b.low, b.p.to(at::kBFloat16))) << n;
    EXPECT_TRUE(at::equal(a.g, kernel_state(n, 11).g)) << "the gradient is read, not scaled in place";
  }
}

// grad_scale is clip_grad_norm_'s multiplication folded into the pass: the same as scaling the gradient first
// (scale_gradient, an fp32 product each) and updating with 1, bit for bit.
TEST(AdamWKernel, TheGradScaleIsTheClipsMultiplication) {
  const float coef = 0.123f;
  KernelState a = kernel_state(4099, 5), b = kernel_state(4099, 5);
  adamw_update(a.p, a.g, a.m, a.v, {}, adamw_scalars(3e-3, 0.1, 0.9, 0.95, 1e-8, 1, coef));
  scale_gradient(b.g, coef);
  adamw_update(b.p, b.g, b.m, b.v, {}, adamw_scalars(3e-3, 0.1, 0.9, 0.95, 1e-8, 1, 1.0f));
  EXPECT_TRUE(at::equal(a.p, b.p));
  EXPECT_TRUE(at::equal(a.m, b.m));
  EXPECT_TRUE(at::equal(a.v, b.v));
}

// The first moment is m + w (g - m) with w = 1 - beta1, the product and the sum rounded once (a fused multiply-add),
// for w below 0.5 (the usual), and g + (w - 1)(g - m) from 0.5 up: how ATen's vectorised lerp_ computes it, so
// there it is lerp_ bit for bit. ATen's scalar kernels (ATEN_CPU_CAPABILITY=default, the baseline kernel path)
// round the product and the sum apart: within those two roundings, 2^-24 (|product| + |result|) each side.
TEST(AdamWKernel, TheFirstMomentIsAtensLerp) {
  const bool aten_vectorised = at::get_cpu_capability() != "DEFAULT";  // torch.backends.cpu.get_cpu_capability()
  for (double beta1 : {0.9, 0.3}) {
    KernelState a = kernel_state(1003, 9);
    const at::Tensor lerp = a.m.clone().lerp_(a.g, 1 - beta1);
    const float w = static_cast<float>(1 - beta1);
    const bool from_grad = w >= 0.5f;
    at::Tensor fused = at::empty_like(a.m), product = at::empty_like(a.m);
    for (int64_t i = 0; i < a.m.numel(); ++i) {
      const float m = a.m[i].item<float>(), g = a.g[i].item<float>();
      const float coefficient = from_grad ? w - 1 : w;
      fused[i] = std::fma(coefficient, g - m, from_grad ? g : m);
      product[i] = coefficient * (g - m);
    }
    for (CpuIsa isa : {CpuIsa::kScalar, max_cpu_isa()}) {
      KernelState b = kernel_state(1003, 9);
      adamw_update(b.p, b.g, b.m, b.v, {}, adamw_scalars(1e-3, 0, beta1, 0.95, 1e-8, 1, 1), isa);
      const std::string what = "beta1 " + std::to_string(beta1) + ", isa " + cpu_isa_name(isa);
      EXPECT_TRUE(at::equal(b.m, fused)) << what;
      if (aten_vectorised) EXPECT_TRUE(at::equal(b.m, lerp)) << what;
      const at::Tensor bound = (product.abs() + lerp.abs()) * std::ldexp(1.0, -23);
      EXPECT_TRUE(((b.m - lerp).abs() <= bound).all().item<bool>()) << what;
    }
  }
}

TEST(AdamWKernel, BadOperandsAreRefused) {
  KernelState a = kernel_state(16, 1);
  const AdamWScalars s = adamw_scalars(1e-3, 0, 0.9, 0.95, 1e-8, 1, 1);
  expect_error([&] { adamw_update(a.p, a.g.narrow(0, 0, 8), a.m, a.v, {}, s); }, {"adamw_update", "one shape"});
  expect_error([&] { adamw_update(a.p, a.g.to(at::kDouble), a.m, a.v, {}, s); }, {"fp32"});
  expect_error([&] { adamw_update(a.p, a.g, a.m, a.v, at::empty({16}), s); }, {"bf16"});
}

// AdamW::step's grad_scale and low-precision copies on both paths: the fused one (the kernel: gradients left
// as they were) and the per-tensor loop (ATen's ops: gradients scaled in place, copies written after). The
// weights agree within the fused-vs-loop bound above; each copy is its own path's weight rounded to bf16.
TEST(AdamW, GradScaleAndLowPrecisionCopiesOnBothPaths) {
  at::manual_seed(3);
  const std::vector<at::Tensor> init = {at::randn({64, 32}), at::randn({32}), at::randn({7, 5, 3})};
  AdamW loop = adamw_of(init, false), fused = adamw_of(init, true);
  ASSERT_TRUE(fused.single_pass(at::kCPU));
  ASSERT_FALSE(loop.single_pass(at::kCPU));
  for (int s = 0; s < 5; ++s) {
    std::vector<at::Tensor> loop_copies, fused_copies, grads;
    for (size_t i = 0; i < init.size(); ++i) {
      grads.push_back(at::randn(init[i].sizes()));
      loop.groups()[i].param.mutable_grad() = grads[i].clone();
      fused.groups()[i].param.mutable_grad() = grads[i].clone();
      // The second parameter has no copy: not every weight is a matmul weight.
      loop_copies.push_back(i == 1 ? at::Tensor() : at::empty(init[i].sizes(), at::kBFloat16));
      fused_copies.push_back(i == 1 ? at::Tensor() : at::empty(init[i].sizes(), at::kBFloat16));
    }
    const float coef = 0.5f + 0.1f * static_cast<float>(s);
    loop.step(1e-2, 0.1, coef, loop_copies);
    fused.step(1e-2, 0.1, coef, fused_copies);
    for (size_t i = 0; i < init.size(); ++i) {
      const at::Tensor &a = loop.groups()[i].param, &b = fused.groups()[i].param;
      EXPECT_LE((a - b).abs().max().item<double>(), 2e-6) << "step " << s << " parameter " << i;
      EXPECT_TRUE(at::equal(b.grad(), grads[i])) << "the kernel reads the gradient without scaling it";
      EXPECT_TRUE(at::equal(a.grad(), grads[i] * coef)) << "the loop scales it first, as clip_grad_norm_ does";
      if (i == 1) continue;
      EXPECT_TRUE(at::equal(loop_copies[i], a.to(at::kBFloat16)));
      EXPECT_TRUE(at::equal(fused_copies[i], b.to(at::kBFloat16)));
    }
  }
  expect_error([&] { fused.step(1e-2, 0.1, 1.0f, {at::Tensor()}); }, {"1 low-precision copies for 3 parameters"});
}

// ---- sweeps (train/sweep.h) ----------------------------------------------------------------------

TEST(Sweep, GridIsTheCartesianProductFirstAxisSlowest) {
  const auto points = expand_sweep_grid(
      {parse_sweep_axis("model.norm_topology=pre,post"), parse_sweep_axis("optim.lr=1e-3,3e-3,1e-2")});
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].name, "norm_topology=pre,lr=1e-3");
  EXPECT_EQ(points[2].name, "norm_topology=pre,lr=1e-2");
  EXPECT_EQ(points[3].name, "norm_topology=post,lr=1e-3");
  EXPECT_EQ(points[5].settings,
            (std::vector<std::pair<std::string, std::string>>{{"model.norm_topology", "post"}, {"optim.lr", "1e-2"}}));
  // Keys whose last parts collide keep their section in the name; unsafe characters become '_'.
  const auto named = expand_sweep_grid({parse_sweep_axis("train.seed=1"), parse_sweep_axis("data.seed=a/b")});
  EXPECT_EQ(named[0].name, "train.seed=1,data.seed=a_b");
}

TEST(Sweep, BadAxesAreRefusedNamingThem) {
  expect_error([] { parse_sweep_axis("lr=1,2"); }, {"--grid 'lr=1,2'", "section.key"});
  expect_error([] { parse_sweep_axis("optim.lr=1,,2"); }, {"empty value"});
  expect_error([] { parse_sweep_axis("optim.lr=1,1"); }, {"'1' appears twice"});
  expect_error(
      [] {
        expand_sweep_grid({parse_sweep_axis("optim.lr=1"), parse_sweep_axis("optim.lr=2")});
      },
      {"'optim.lr' is given twice"});
}

TEST(Sweep, LossSpikesAreRelativeToTheRunningMedian) {
  std::vector<double> losses;
  for (int i = 0; i < 40; ++i) losses.push_back(5.0 - 0.05 * i);  // a falling curve: no spikes
  EXPECT_TRUE(loss_spikes(losses, {10, 1.2}).empty());
  losses[25] = 1.3 * losses[24];  // one step jumps 30% above its neighbours (~24% above the lagging median)
  losses[33] = 1.1 * losses[32];  // 10%: below the rule's 20%
  losses[30] = std::nan("");      // non-finite losses are not spikes and do not enter the median
  EXPECT_EQ(loss_spikes(losses, {10, 1.2}), (std::vector<int64_t>{25}));
  EXPECT_TRUE(loss_spikes({9, 9, 50}, {10, 1.2}).empty());  // the first `window` steps are never spikes
}
