// Test-only fault injection for sharded training. ARCHSPACE_TEST_FAULT breaks FSDP on purpose, so that the
// tests can show that their equivalence checks catch a broken reduction or shard layout (mutation tests) and
// that a rank dying inside a sharded collective ends every rank. It is read here and nowhere else; a real
// run never sets it (the trainer says so on stderr when it is set).
//   drop_reduce_scatter        every rank keeps its own gradient shard instead of the sum over the ranks
//   shard_offset               every rank takes the shard one element further on when it cuts its shards
//   die_in_reduce_scatter@N    the process kills itself (SIGKILL) instead of reduce-scattering the embedding's
//                              gradients in step N (1-based; the last reduce-scatter of the step's backward)
//   die_in_all_gather@N        the process kills itself instead of all-gathering the embedding in step N (the
//                              step's first all-gather)
#pragma once

#include <cstdint>

namespace archspace {

enum class TestFault { kNone, kDropReduceScatter, kShardOffset, kDieInReduceScatter, kDieInAllGather };

struct TestFaultSpec {
  TestFault fault = TestFault::kNone;
  int64_t step = 0;  // the die_* faults: the 1-based step
};

// ARCHSPACE_TEST_FAULT, parsed once; throws archspace::Error naming the variable on an unknown value.
const TestFaultSpec& test_fault();
bool test_fault_is(TestFault f);

// Kills this process (SIGKILL: no handlers, no flushing), as a crashed or OOM-killed rank ends.
[[noreturn]] void die_for_test_fault();

}  // namespace archspace
