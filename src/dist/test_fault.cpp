#include "archspace/dist/test_fault.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "archspace/util/error.h"

namespace archspace {

namespace {

TestFaultSpec parse_test_fault() {
  const char* env = std::getenv("ARCHSPACE_TEST_FAULT");
  TestFaultSpec spec;
  if (!env || !*env) return spec;
  const std::string text = env;
  const size_t at = text.find('@');
  const std::string name = text.substr(0, at);
  const auto bad = [&] {
    return Error("ARCHSPACE_TEST_FAULT='" + text +
                 "' is not a test fault (drop_reduce_scatter, shard_offset, die_in_reduce_scatter@STEP, "
                 "die_in_all_gather@STEP)");
  };
  if (name == "drop_reduce_scatter") {
    spec.fault = TestFault::kDropReduceScatter;
  } else if (name == "shard_offset") {
    spec.fault = TestFault::kShardOffset;
  } else if (name == "die_in_reduce_scatter" || name == "die_in_all_gather") {
    spec.fault = name == "die_in_all_gather" ? TestFault::kDieInAllGather : TestFault::kDieInReduceScatter;
    if (at == std::string::npos) throw bad();
    try {
      size_t used = 0;
      spec.step = std::stoll(text.substr(at + 1), &used);
      if (used != text.size() - at - 1 || spec.step < 1) throw bad();
    } catch (const std::logic_error&) {
      throw bad();
    }
    return spec;
  } else {
    throw bad();
  }
  if (at != std::string::npos) throw bad();
  return spec;
}

}  // namespace

const TestFaultSpec& test_fault() {
  static const TestFaultSpec spec = parse_test_fault();
  return spec;
}

bool test_fault_is(TestFault f) { return test_fault().fault == f; }

void die_for_test_fault() {
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

}  // namespace archspace
