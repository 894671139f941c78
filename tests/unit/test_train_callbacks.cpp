// The seams of the training loop: the callbacks' hooks (train/callback.h) run in registration order with the
// trainer's step numbers, a callback can skip an update or end the run through on_error, and the gradient strategy
// of a run is chosen from its world size and train.sharding (train/gradient_strategy.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "archspace/data/token_shards.h"
#include "archspace/train/callback.h"
#include "archspace/train/gradient_strategy.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;
namespace fs = std::filesystem;

namespace {

// A tiny tokenized corpus and a run on the "tiny" preset: one instance a step, `max_steps` steps.
TrainConfig tiny_run(const fs::path& dir, int64_t max_steps) {
  ShardWriter w((dir / "shards").string(), 100000);
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 400; ++i) ids.push_back(2 + (i * 7) % 13);
  w.add_document(ids);
  ShardManifest m;
  m.tokenizer_name = "synthetic";
  m.tokenizer_sha256 = "0";
  m.vocab_size = 16;
  m.eos_token_id = 0;
  w.finish(m);
  const fs::path toml = dir / "run.toml";
  std::ofstream(toml) << "[model]\npreset = \"tiny\"\n[data]\ntrain = \"" << (dir / "shards").string()
                      << "\"\nshuffle = false\n[train]\nrun_dir = \"" << (dir / "run").string()
                      << "\"\nsequence_length = 16\nmicro_batch = 1\ngrad_accum = 1\nthreads = 1\nmax_steps = "
                      << max_steps << "\n[optim]\nlr = 1e-3\nwarmup_steps = 0\n";
  return TrainConfig::load(toml.string());
}

TrainOptions quiet() {
  TrainOptions o;
  o.progress = false;
  return o;
}

// Records every hook it sees as "NAME hook step"; optionally skips the update, throws or raises SIGTERM at a step.
class Recorder final : public TrainCallback {
 public:
  Recorder(std::string name, std::vector<std::string>& events) : name_(std::move(name)), events_(events) {}
  int64_t skip_at = -1, throw_at = -1, signal_at = -1;

  std::string name() const override { return name_; }
  void on_start(Trainer&) override { log("on_start"); }
  void pre_step(Trainer&, int64_t step) override { log("pre_step", step); }
  void post_backward(Trainer&, int64_t step) override { log("post_backward", step); }
  bool pre_optim_step(Trainer&, int64_t step, StepStats&) override {
    log("pre_optim_step", step);
    return step != skip_at;
  }
  void post_step(Trainer&, int64_t step, const StepStats& stats, double) override {
    log(stats.skipped ? "post_step(skipped)" : "post_step", step);
    if (step == throw_at) throw Error("thrown by " + name_);
    if (step == signal_at) std::raise(SIGTERM);  // the trainer's handler notes it; the run stops after this step
  }
  void on_stop_signal(Trainer&, int64_t step, int signal) override {
    log(signal == SIGTERM ? "on_stop_signal(SIGTERM)" : "on_stop_signal", step);
  }
  void post_checkpoint_saved(Trainer&, int64_t step, const std::string&) override { log("checkpoint", step); }
  void post_train(Trainer&) override { log("post_train"); }
  void on_error(Trainer&, const std::exception& e) override { events_.push_back(name_ + " on_error " + e.what()); }

 private:
  void log(const std::string& hook, int64_t step = -1) {
    events_.push_back(name_ + " " + hook + (step >= 0 ? " " + std::to_string(step) : ""));
  }
  std::string name_;
  std::vector<std::string>& events_;
};

std::vector<std::string> names(const Trainer& t) {
  std::vector<std::string> n;
  for (const auto& c : t.callbacks().all()) n.push_back(c->name());
  return n;
}

}  // namespace

TEST(TrainCallbacks, TheConfigsCallbacksAreRegisteredInTheOrderOfTheirSideEffects) {
  const fs::path dir = archspace::testing::fresh_dir("callbacks_registered");
  Trainer trainer(tiny_run(dir, 2), quiet());
  EXPECT_EQ(names(trainer), (std::vector<std::string>{"metrics_log", "progress", "nonfinite_policy", "skip_step",
                                                      "spike_policy", "checkpointing"}));
  // Step skipping is the olmo-core recipe's (the default); the others leave it out.
  TrainConfig megatron = tiny_run(archspace::testing::fresh_dir("callbacks_registered_megatron"), 2);
  megatron.skip_steps = false;
  Trainer without(megatron, quiet());
  EXPECT_EQ(names(without),
            (std::vector<std::string>{"metrics_log", "progress", "nonfinite_policy", "spike_policy", "checkpointing"}));
}

TEST(TrainCallbacks, HooksRunInRegistrationOrderWithTheStepNumbers) {
  const fs::path dir = archspace::testing::fresh_dir("callbacks_order");
  Trainer trainer(tiny_run(dir, 2), quiet());
  std::vector<std::string> events;
  trainer.add_callback(std::make_unique<Recorder>("a", events));
  trainer.add_callback(std::make_unique<Recorder>("b", events));
  const TrainResult result = trainer.run();
  ASSERT_EQ(result.losses.size(), 2u);
  std::vector<std::string> expected = {"a on_start", "b on_start"};
  for (int step = 0; step < 2; ++step)
    for (const char* hook : {"pre_step", "post_backward", "pre_optim_step"})
      for (const char* who : {"a", "b"}) expected.push_back(std::string(who) + " " + hook + " " + std::to_string(step));
  // The checkpointing callback (registered before a and b) saves the last step inside post_step.
  expected.insert(expected.begin() + 8, {"a post_step 0", "b post_step 0"});
  expected.insert(expected.end(), {"a checkpoint 2", "b checkpoint 2", "a post_step 1", "b post_step 1", "a post_train",
                                   "b post_train"});
  EXPECT_EQ(events, expected);
}

// A stop signal ends the run after its step, and saving that step is the checkpointing callback's (registered
// before the recorder, so its checkpoint comes first); the run resumes from it.
TEST(TrainCallbacks, AStopSignalsCheckpointIsTheCheckpointingCallbacks) {
  const fs::path dir = archspace::testing::fresh_dir("callbacks_stop_signal");
  Trainer trainer(tiny_run(dir, 5), quiet());
  std::vector<std::string> events;
  auto recorder = std::make_unique<Recorder>("a", events);
  recorder->signal_at = 1;
  trainer.add_callback(std::move(recorder));
  const TrainResult result = trainer.run();
  EXPECT_EQ(result.stopped_by_signal, SIGTERM);
  ASSERT_EQ(result.losses.size(), 2u);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(
      std::vector<std::string>(events.end() - 4, events.end()),
      (std::vector<std::string>{"a post_step 1", "a checkpoint 2", "a on_stop_signal(SIGTERM) 1", "a post_train"}));
  EXPECT_EQ(fs::path(result.final_checkpoint).filename(), "step-00000002");
}

TEST(TrainCallbacks, ASkippedUpdateSkipsTheLaterCallbacksAndIsLogged) {
  const fs::path dir = archspace::testing::fresh_dir("callbacks_skip");
  Trainer trainer(tiny_run(dir, 2), quiet());
  std::vector<std::string> events;
  auto a = std::make_unique<Recorder>("a", events);
  a->skip_at = 1;
  trainer.add_callback(std::move(a));
  trainer.add_callback(std::make_unique<Recorder>("b", events));
  trainer.run();
  // Step 1 was skipped: b never saw its pre_optim_step, and metrics.jsonl says so.
  EXPECT_NE(std::find(events.begin(), events.end(), "b pre_optim_step 0"), events.end());
  EXPECT_EQ(std::find(events.begin(), events.end(), "b pre_optim_step 1"), events.end());
  EXPECT_NE(std::find(events.begin(), events.end(), "b post_step(skipped) 1"), events.end());
  std::ifstream in(dir / "run" / "metrics.jsonl");
  std::string line, text;
  while (std::getline(in, line)) text += line + "\n";
  EXPECT_NE(text.find("{\"skipped\":true,\"step\":2}"), std::string::npos) << text;
}

TEST(TrainCallbacks, AnErrorInAHookGoesThroughEveryOnErrorAndIsRethrown) {
  const fs::path dir = archspace::testing::fresh_dir("callbacks_error");
  Trainer trainer(tiny_run(dir, 3), quiet());
  std::vector<std::string> events;
  auto a = std::make_unique<Recorder>("a", events);
  a->throw_at = 0;
  trainer.add_callback(std::move(a));
  trainer.add_callback(std::make_unique<Recorder>("b", events));
  archspace::testing::expect_error([&] { trainer.run(); }, {"thrown by a"});
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2], "a on_error thrown by a");
  EXPECT_EQ(events.back(), "b on_error thrown by a");
  EXPECT_EQ(std::find(events.begin(), events.end(), "b post_step 0"), events.end());  // after a's throw: none
}

TEST(GradientStrategy, TheModeIsChosenOnceFromTheWorldSizeAndSharding) {
  TrainConfig cfg;
  for (Sharding s : {Sharding::kNone, Sharding::kOptimizer, Sharding::kFull}) {
    cfg.sharding = s;
    EXPECT_EQ(parallel_mode(cfg, 1), ParallelMode::kSingleProcess);  // one process shards nothing
  }
  cfg.sharding = Sharding::kNone;
  EXPECT_EQ(parallel_mode(cfg, 4), ParallelMode::kDataParallel);
  cfg.sharding = Sharding::kOptimizer;
  EXPECT_EQ(parallel_mode(cfg, 4), ParallelMode::kDataParallel);  // ZeRO-1 is data-parallel's optimizer sharding
  cfg.sharding = Sharding::kFull;
  EXPECT_EQ(parallel_mode(cfg, 2), ParallelMode::kFullySharded);
  EXPECT_STREQ(parallel_mode_name(ParallelMode::kFullySharded), "fully sharded");
}
