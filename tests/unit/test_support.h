// Shared by the unit tests: expected errors and fresh temporary directories.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "archspace/util/error.h"

namespace archspace::testing {

inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' not in: " << e.what();
  }
}

// An empty directory of its own under the system's temp dir (per test name and process).
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("archspace_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace archspace::testing
