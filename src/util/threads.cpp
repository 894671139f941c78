#include "archspace/util/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace archspace {

namespace {

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// Total and idle jiffies of all CPUs (first line of /proc/stat); false when unreadable.
bool read_cpu_times(double& total, double& idle) {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user, nice, system, idle_t, iowait, irq, softirq, steal;
  if (!(in >> cpu >> user >> nice >> system >> idle_t >> iowait >> irq >> softirq >> steal) || cpu != "cpu")
    return false;
  total = user + nice + system + idle_t + iowait + irq + softirq + steal;
  idle = idle_t + iowait;
  return true;
}

}  // namespace

int default_thread_count() {
  if (const char* env = std::getenv("ARCHSPACE_THREADS"); env && std::atoi(env) > 0) return std::atoi(env);
  const int cores = usable_cores();
  if (cores == 1) return 1;
  double total0, idle0, total1, idle1;
  if (!read_cpu_times(total0, idle0)) return cores;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!read_cpu_times(total1, idle1) || total1 <= total0) return cores;
  // Idle share of all online CPUs, scaled to the cores we may use.
  const long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const double idle_cpus = (idle1 - idle0) / (total1 - total0) * static_cast<double>(online);
  return std::clamp(static_cast<int>(std::lround(idle_cpus)), 1, cores);
}

}  // namespace archspace
