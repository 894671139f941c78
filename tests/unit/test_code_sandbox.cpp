// eval/code_sandbox.h: ordinary programs pass or fail as human-eval's check_correctness decides, and hostile ones
// fail and harm nothing, checked from outside the sandbox (files, sockets, processes, the environment). Each
// isolation layer is also checked alone. Skipped, with the reason, where the machine cannot run the sandbox.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "archspace/eval/code_sandbox.h"
#include "test_support.h"

namespace archspace {
namespace {

namespace fs = std::filesystem;

// Skips without a sandbox; else holds the machine-wide sandbox test lock for the rest of the test.
#define REQUIRE_SANDBOX()                                                                            \
  if (!sandbox_support().available) GTEST_SKIP() << "no sandbox here: " << sandbox_support().reason; \
  const testing::SandboxTestLock sandbox_test_lock

SandboxLimits quick() {
  SandboxLimits l;
  l.timeout_seconds = 1;
  l.grace_seconds = 1;
  return l;
}

std::string read_file(const fs::path& p) {
  std::stringstream s;
  s << std::ifstream(p).rdbuf();
  return s.str();
}

// Processes left in nested PID namespaces (the sandbox's, if any survived): NSpid lists more than one id.
int nested_namespace_processes() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream status(e.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("NSpid:", 0) == 0) {
        std::istringstream ids(line.substr(6));
        int count = 0;
        for (std::string id; ids >> id;) ++count;
        n += count > 1;
      }
    }
  }
  return n;
}

int host_processes() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc"))
    n += e.path().filename().string().find_first_not_of("0123456789") == std::string::npos;
  return n;
}

TEST(CodeSandbox, PassesOnlyAProgramThatRunsToItsEnd) {
  REQUIRE_SANDBOX();
  const auto ok = run_python_sandboxed("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('done')\n");
  EXPECT_TRUE(ok.passed) << ok.output;
  EXPECT_EQ(ok.status, "passed");
  EXPECT_EQ(ok.output, "done\n");
  // human-eval counts an exception, and also exit() / sys.exit (a SystemExit), as a failure; os._exit(0) before
  // the end and a syntax error fail too.
  for (const std::string program :
       {"assert 1 == 2\n", "import sys\nsys.exit(0)\n", "exit()\n", "import os\nos._exit(0)\n", "def f(:\n",
        "input()\n", "print('PASSED')\nquit(0)\n"}) {
    const auto r = run_python_sandboxed(program);
    EXPECT_FALSE(r.passed) << program;
    EXPECT_EQ(r.status, "failed") << program << r.output;
  }
  const auto assertion = run_python_sandboxed("assert 1 == 2, 'one is not two'\n");
  EXPECT_NE(assertion.output.find("AssertionError: one is not two"), std::string::npos) << assertion.output;
}

TEST(CodeSandbox, AnInfiniteLoopIsStoppedAtTheTimeout) {
  REQUIRE_SANDBOX();
  // The harness' SIGALRM (as human-eval's time_limit) stops a plain loop: with a long grace, the loop ends well
  // before the hard kill even on a loaded machine (a 2 s grace was missed under load average 8).
  SandboxLimits patient = quick();
  patient.grace_seconds = 20;
  const auto loop = run_python_sandboxed("while True:\n    pass\n", patient);
  EXPECT_FALSE(loop.passed);
  EXPECT_EQ(loop.status, "timed out");
  EXPECT_NE(loop.signal, SIGKILL);
  EXPECT_LT(loop.seconds, patient.timeout_seconds + patient.grace_seconds);
  const SandboxLimits l = quick();
  // A program that ignores the alarm is killed with its whole namespace at timeout + grace.
  const auto stubborn =
      run_python_sandboxed("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n", l);
  EXPECT_EQ(stubborn.status, "timed out");
  EXPECT_EQ(stubborn.signal, SIGKILL);
  EXPECT_GE(stubborn.seconds, l.timeout_seconds + l.grace_seconds - 0.1);
  EXPECT_LT(stubborn.seconds, l.timeout_seconds + l.grace_seconds + 3);
  EXPECT_EQ(nested_namespace_processes(), 0);
}

TEST(CodeSandbox, AForkBombStopsAtTheProcessLimitAndLeavesNothingBehind) {
  REQUIRE_SANDBOX();
  const SandboxLimits l = quick();
  const int before = host_processes();
  // Children that linger (sleeping) and a parent that forks until refused, then spins until killed.
  const auto bomb = run_python_sandboxed(
      "import os, signal, time\n"
      "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
      "n = 0\n"
      "while True:\n"
      "    try:\n"
      "        if os.fork() == 0:\n"
      "            time.sleep(1000)\n"
      "        n += 1\n"
      "    except OSError as e:\n"
      "        print('fork refused after', n, flush=True)\n"
      "        break\n"
      "while True:\n"
      "    pass\n",
      l);
  EXPECT_FALSE(bomb.passed);
  EXPECT_EQ(bomb.status, "timed out");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(bomb.output, m, std::regex("fork refused after (\\d+)"))) << bomb.output;
  EXPECT_LT(std::stoi(m[1]), l.processes);
  // The classic bomb: every process forks forever.
  const auto classic = run_python_sandboxed(
      "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
      "        pass\n",
      l);
  EXPECT_FALSE(classic.passed);
  EXPECT_EQ(nested_namespace_processes(), 0);
  EXPECT_LE(host_processes(), before + 8);  // other work on the machine may start a few
}

TEST(CodeSandbox, AMemoryHogFails) {
  REQUIRE_SANDBOX();
  const auto r = run_python_sandboxed("x = bytearray(4 << 30)\nprint(len(x))\n");
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.output.find("MemoryError"), std::string::npos) << r.output;
  const auto big = run_python_sandboxed("open('big', 'wb').write(b'x' * (64 << 20))\n");  // RLIMIT_FSIZE: 16 MiB
  EXPECT_FALSE(big.passed);
  EXPECT_NE(big.output.find("File too large"), std::string::npos) << big.output;
}

// Writes outside the scratch directory into a directory anyone may write, to a file anyone may write, and
// next to the scratch directory; every attempt must fail and leave no trace.
// Landlock does not handle chmod (only the read-only mounts stop it), so `metadata` leaves it out.
void expect_writes_stay_inside(const SandboxLayers& layers, const std::string& errno_name, bool metadata = true) {
  const fs::path dir = testing::fresh_dir("sandbox_outside");
  fs::permissions(dir, fs::perms::all);
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "original";
  fs::permissions(victim, fs::perms::all);
  const std::string token = "escape-" + std::to_string(::getpid());
  const fs::path next_to_scratch = fs::temp_directory_path() / token;
  const std::string program =
      "import os\n"
      "errors = []\n"
      "def attempt(f):\n"
      "    try:\n"
      "        f()\n"
      "        print('DID', f.__name__)\n"
      "    except OSError as e:\n"
      "        errors.append(e.errno)\n"
      "def new_file(): open('" +
      (dir / "new.txt").string() +
      "', 'w').write('x')\n"
      "def append(): open('" +
      victim.string() +
      "', 'a').write('x')\n"
      "def truncate(): os.truncate('" +
      victim.string() +
      "', 0)\n"
      "def chmod(): os.chmod('" +
      victim.string() +
      "', 0)\n"
      "def unlink(): os.unlink('" +
      victim.string() +
      "')\n"
      "def mkdir(): os.mkdir('" +
      (dir / "d").string() +
      "')\n"
      "def symlink(): os.symlink('/etc/passwd', '" +
      (dir / "link").string() +
      "')\n"
      "def beside(): open('../" +
      token +
      "', 'w').write('x')\n"
      "for f in (new_file, append, truncate, " +
      std::string(metadata ? "chmod, " : "") +
      "unlink, mkdir, symlink, beside):\n"
      "    attempt(f)\n"
      "import errno\n"
      "print('errors', sorted(set(errno.errorcode[e] for e in errors)))\n"
      "open('inside.txt', 'w').write('mine')\n"
      "assert open('inside.txt').read() == 'mine'\n"
      "print('cwd', os.getcwd())\n"
      "assert len(errors) < " +
      std::string(metadata ? "8" : "7") + ", 'nothing could be written outside'\n";
  const auto r = run_python_sandboxed(program, SandboxLimits{}, layers);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.output.find("DID"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("errors ['" + errno_name + "']"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nothing could be written outside"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(victim), "original");
  EXPECT_EQ(fs::status(victim).permissions(), fs::perms::all);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  EXPECT_FALSE(fs::exists(next_to_scratch));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("cwd (\\S+)"))) << r.output;
  EXPECT_FALSE(fs::exists(m[1].str())) << "the scratch directory was not removed";
  fs::remove_all(dir);
  fs::remove(next_to_scratch);
}

TEST(CodeSandbox, WritesOutsideTheScratchDirectoryFail) {
  REQUIRE_SANDBOX();
  expect_writes_stay_inside(SandboxLayers{}, "EROFS");
}

TEST(CodeSandbox, EachFileSystemLayerHoldsAlone) {
  REQUIRE_SANDBOX();
  SandboxLayers mounts_only;
  mounts_only.landlock = false;
  expect_writes_stay_inside(mounts_only, "EROFS");
  if (sandbox_support().landlock_abi == 0) GTEST_SKIP() << "the kernel has no Landlock";
  SandboxLayers landlock_only;
  landlock_only.read_only_mounts = false;
  expect_writes_stay_inside(landlock_only, "EACCES", /*metadata=*/false);
}

TEST(CodeSandbox, TheParentsEnvironmentIsNotVisible) {
  REQUIRE_SANDBOX();
  const std::string secret = "s3cr3t-" + std::to_string(::getpid()) + "-" + std::to_string(::time(nullptr));
  ::setenv("ARCHSPACE_TEST_SECRET", secret.c_str(), 1);
  const auto r = run_python_sandboxed(
      "import os\n"
      "seen = [repr(dict(os.environ))]\n"
      "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
      "for pid in pids + ['self', str(os.getppid())]:\n"
      "    for what in ('environ', 'cmdline'):\n"
      "        try:\n"
      "            seen.append(open('/proc/%s/%s' % (pid, what), 'rb').read().decode('latin-1'))\n"
      "        except OSError:\n"
      "            pass\n"
      "print('pids', pids, 'ppid', os.getppid())\n"
      "print('\\n'.join(seen))\n"
      "assert any('ARCHSPACE_TEST_SECRET' in s for s in seen), 'no secret found'\n");
  ::unsetenv("ARCHSPACE_TEST_SECRET");
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.output.find("no secret found"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(secret), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pids ['1'] ppid 0"), std::string::npos) << r.output;  // its own PID namespace
}

struct Listener {
  int fd = -1;
  std::string address;
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  bool got_connection() const {
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK);
    if (c >= 0) ::close(c);
    return c >= 0;
  }
};

Listener tcp_listener() {
  Listener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  EXPECT_EQ(::bind(l.fd, reinterpret_cast<sockaddr*>(&a), n), 0);
  EXPECT_EQ(::listen(l.fd, 4), 0);
  ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&a), &n);
  l.address = std::to_string(ntohs(a.sin_port));
  return l;
}

Listener unix_listener(const fs::path& path) {
  Listener l;
  l.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  EXPECT_EQ(::bind(l.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(l.fd, 4), 0);
  ::chmod(path.c_str(), 0777);
  l.address = path.string();
  return l;
}

TEST(CodeSandbox, NoNetworkAndNoHostSockets) {
  REQUIRE_SANDBOX();
  const fs::path dir = testing::fresh_dir("sandbox_sockets");
  fs::permissions(dir, fs::perms::all);
  Listener tcp = tcp_listener(), unix_socket = unix_listener(dir / "s");
  const std::string program =
      "import socket\n"
      "connected = []\n"
      "for family, address in ((socket.AF_INET, ('127.0.0.1', " +
      tcp.address + ")), (socket.AF_UNIX, '" + unix_socket.address +
      "')):\n"
      "    try:\n"
      "        s = socket.socket(family, socket.SOCK_STREAM)\n"
      "        s.settimeout(1)\n"
      "        s.connect(address)\n"
      "        connected.append(address)\n"
      "    except OSError as e:\n"
      "        print('refused', family, e)\n"
      "assert connected, 'no connection'\n";
  const auto r = run_python_sandboxed(program);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.output.find("no connection"), std::string::npos) << r.output;
  EXPECT_FALSE(tcp.got_connection());
  EXPECT_FALSE(unix_socket.got_connection());
  // Without the seccomp filter and Landlock (which refuses TCP connect too), the empty network namespace alone
  // still keeps TCP away.
  SandboxLayers no_seccomp;
  no_seccomp.seccomp = false;
  no_seccomp.landlock = false;
  const auto alone =
      run_python_sandboxed("import socket\nsocket.create_connection(('127.0.0.1', " + tcp.address + "), timeout=1)\n",
                           SandboxLimits{}, no_seccomp);
  EXPECT_FALSE(alone.passed);
  EXPECT_NE(alone.output.find("Network is unreachable"), std::string::npos) << alone.output;
  EXPECT_FALSE(tcp.got_connection());
  fs::remove_all(dir);
}

TEST(CodeSandbox, HugeOutputIsCapped) {
  REQUIRE_SANDBOX();
  SandboxLimits l;
  const auto r = run_python_sandboxed("import sys\nfor _ in range(20):\n    sys.stdout.write('x' * (1 << 20))\n", l);
  EXPECT_TRUE(r.passed) << r.status;
  EXPECT_TRUE(r.output_truncated);
  EXPECT_EQ(static_cast<int64_t>(r.output.size()), l.output_bytes);
}

TEST(CodeSandbox, RunsUnprivilegedWithAnEmptyEnvironment) {
  REQUIRE_SANDBOX();
  const auto r = run_python_sandboxed(
      "import os, sys\n"
      "status = open('/proc/self/status').read()\n"
      "caps = [l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapAmb'))]\n"
      "assert caps == ['0000000000000000'] * 3, caps\n"
      "assert os.getuid() != 0 and os.geteuid() != 0\n"
      "assert 'NoNewPrivs:\\t1' in status\n"
      "assert set(os.environ) <= {'LC_CTYPE'}, os.environ\n"  // set by Python's C-locale coercion
      "assert sys.stdin.read() == ''\n"
      "assert 'site' not in sys.modules\n");
  EXPECT_TRUE(r.passed) << r.output;
}

TEST(CodeSandbox, RunsManyInParallelInOrder) {
  REQUIRE_SANDBOX();
  std::vector<std::string> programs;
  for (int i = 0; i < 12; ++i) programs.push_back("assert " + std::to_string(i) + " % 3 != 0\n");
  const auto results = run_python_sandboxed(programs, SandboxLimits{}, 4);
  ASSERT_EQ(results.size(), programs.size());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(results[i].passed, i % 3 != 0) << i;
}

// Where the kernel refuses a namespace, nothing runs: a child process whose unshare(2) is denied by seccomp.
TEST(CodeSandbox, FailsClosedWithoutIsolation) {
  REQUIRE_SANDBOX();
  const fs::path marker = testing::fresh_dir("sandbox_closed") / "ran";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_unshare, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) _exit(2);
    try {
      run_python_sandboxed("open('" + marker.string() + "', 'w').write('x')\n");
      _exit(3);
    } catch (const Error& e) {
      const std::string what = e.what();
      _exit(what.find("isolation unavailable") != std::string::npos && what.find("unshare") != std::string::npos &&
                    what.find("no program was run") != std::string::npos
                ? 0
                : 4);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(marker));
  fs::remove_all(marker.parent_path());

  ::setenv("ARCHSPACE_SANDBOX_PYTHON", "/nonexistent/python3", 1);
  testing::expect_error([] { run_python_sandboxed("pass\n"); }, {"no Python interpreter at /nonexistent/python3"});
  ::unsetenv("ARCHSPACE_SANDBOX_PYTHON");
}

}  // namespace
}  // namespace archspace
