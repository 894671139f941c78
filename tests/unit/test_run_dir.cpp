// Run directories: the one-process lock, and checkpoint verification that an edited checksums list cannot
// switch off.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "archspace/io/run_dir.h"
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
