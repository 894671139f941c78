// Shared by the unit tests: expected errors, fresh temporary directories, and the kernel paths to check.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/util/error.h"

namespace archspace::testing {

// The kernel paths (kernels/cpu_isa) this machine can run: a kernel test checks each of them in one process.
inline std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> paths;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512Bf16})
    if (isa <= detected_cpu_isa()) paths.push_back(isa);
  return paths;
}

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

// Held by every test that runs code sandboxes: they check the whole machine for processes left in nested PID
// namespaces, which another test's sandboxes (ctest -j runs test processes side by side) would otherwise be.
class SandboxTestLock {
 public:
  SandboxTestLock() : fd_(::open("/tmp/archspace-unit-sandbox.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0666)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~SandboxTestLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  SandboxTestLock(const SandboxTestLock&) = delete;
  SandboxTestLock& operator=(const SandboxTestLock&) = delete;

 private:
  int fd_;
};

}  // namespace archspace::testing
