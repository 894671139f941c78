// Run directories: the one-process lock, checkpoint verification that an edited checksums list cannot switch off,
// publishing a checkpoint (idempotent, so that an interrupted final save can be completed), the refusal of a
// half-finished run directory, and file writes whose errors name the file and the system's reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <vector>

#include "archspace/io/run_dir.h"
#include "archspace/train/checkpoint.h"
#include "archspace/util/file_writer.h"
#include "test_support.h"

using namespace archspace;
using archspace::testing::expect_error;
namespace fs = std::filesystem;

using archspace::testing::fresh_dir;

TEST(RunDirLock, ASecondHolderIsRefusedNamingThePid) {
  const fs::path run = fresh_dir("lock");
  {
    RunDirLock first(run.string());
    expect_error([&] { RunDirLock second(run.string()); },
                 {run.string(), "pid " + std::to_string(::getpid()), "another process"});
  }
  RunDirLock again(run.string());  // released with the first holder
}

TEST(VerifyCheckpoint, EveryFileMustBeListed) {
  const fs::path ckpt = fresh_dir("ckpt");
  std::ofstream(ckpt / "a.txt") << "x";
  std::ofstream(ckpt / "checksums.json") << "{}";
  expect_error([&] { verify_checkpoint(ckpt.string()); }, {"checksums.json", "does not list a.txt"});
  std::ofstream(ckpt / "checksums.json")
      << R"({"a.txt": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"})";
  verify_checkpoint(ckpt.string());  // sha256("x")
  std::ofstream(ckpt / "a.txt") << "y";
  expect_error([&] { verify_checkpoint(ckpt.string()); }, {"a.txt", "checksum mismatch"});
}

namespace {
// A checkpoint directory as save_checkpoint leaves it (only what publishing and lookup read).
void fake_checkpoint(const fs::path& run, int64_t step) {
  const fs::path dir = run / "checkpoints" / checkpoint_name(step);
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model" / "config.json") << "{}";
  std::ofstream(dir / "checksums.json") << "{}";
}
std::string pointer(const fs::path& run, const char* name) {
  std::string text;
  std::ifstream(run / "checkpoints" / name) >> text;
  return text;
}
}  // namespace

TEST(PublishCheckpoint, NamesItPrunesAndIsIdempotent) {
  const fs::path run = fresh_dir("publish");
  for (int64_t step : {2, 4, 6}) fake_checkpoint(run, step);
  fs::create_directories(run / "checkpoints" / ".tmp-step-00000008");  // an interrupted save's leftovers
  fs::create_directories(run / "checkpoints" / ".pruned-step-00000000");
  const auto changed = publish_checkpoint(run.string(), "step-00000006", 2, true);
  EXPECT_EQ(changed, (std::vector<std::string>{"latest", "final", "removed step-00000002",
                                               "removed .pruned-step-00000000", "removed .tmp-step-00000008"}));
  EXPECT_EQ(pointer(run, "latest"), "step-00000006");
  EXPECT_EQ(pointer(run, "final"), "step-00000006");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"final", "latest", "step-00000004", "step-00000006"}));
  EXPECT_TRUE(publish_checkpoint(run.string(), "step-00000006", 2, true).empty());  // done: nothing to change
  expect_error([&] { publish_checkpoint(run.string(), "step-00000010", 2, true); }, {"step-00000010", "no such"});
}

TEST(PublishCheckpoint, AHalfFinishedRunIsRefusedSayingHowToCompleteIt) {
  const fs::path run = fresh_dir("half_finished");
  fake_checkpoint(run, 2);
  fake_checkpoint(run, 4);
  publish_checkpoint(run.string(), "step-00000002", 2, false);  // `latest` names step 2; step 4 was never named
  expect_error([&] { resolve_model_dir(run.string()); },
               {"has not finished", "checkpoints/final is missing", "step-00000004", "--resume",
                "step-00000004/train_config.toml"});
  publish_checkpoint(run.string(), "step-00000004", 2, true);
  EXPECT_EQ(resolve_model_dir(run.string()), (run / "checkpoints" / "step-00000004" / "model").string());
  std::ofstream(run / "checkpoints" / "final") << "step-00000009\n";
  expect_error([&] { resolve_model_dir(run.string()); }, {"final", "step-00000009", "not a checkpoint of the run"});
}

// /dev/full fails every write with ENOSPC: the kernel's own full disk, without mounting one.
TEST(FileWriter, AFullDiskIsNamedWithTheFile) {
  expect_error([] { write_file("/dev/full", "x"); }, {"/dev/full", "write failed", "No space left on device"});
  const fs::path dir = fresh_dir("file_writer");
  std::ofstream(dir / "source") << std::string(3u << 20, 'a');  // three copy buffers' worth
  expect_error([&] { copy_file_contents((dir / "source").string(), "/dev/full"); },
               {"/dev/full", "write failed", "No space left on device"});
  expect_error([&] { copy_file_contents((dir / "absent").string(), (dir / "copy").string()); },
               {"absent", "cannot open for reading", "No such file or directory"});
  expect_error([&] { write_file((dir / "no" / "such" / "dir").string(), "x"); },
               {"no/such/dir", "cannot open for writing", "No such file or directory"});
  copy_file_contents((dir / "source").string(), (dir / "copy").string());
  EXPECT_EQ(fs::file_size(dir / "copy"), 3u << 20);
  EXPECT_EQ(file_error("f", "write failed", EDQUOT), "f: write failed: Disk quota exceeded");
  EXPECT_EQ(file_error("f", "write failed", EROFS), "f: write failed: Read-only file system");
}
