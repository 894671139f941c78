#include "archspace/util/malloc_policy.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace archspace {

namespace {
bool user_tuned_malloc() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return true;
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(name)) return true;
  return false;
}
}  // namespace

std::string use_huge_pages_for_large_tensors() {
#if defined(__linux__)
  if (std::getenv("THP_MEM_ALLOC_ENABLE")) return "";
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream modes;
  modes << thp.rdbuf();
  if (!thp || modes.str().find("[never]") != std::string::npos) return "";
  if (setenv("THP_MEM_ALLOC_ENABLE", "1", 0) != 0) return "";
  return "large tensors on transparent huge pages (THP_MEM_ALLOC_ENABLE=0 turns it off)";
#else
  return "";
#endif
}

std::string keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  if (user_tuned_malloc()) return "";
  // No block through mmap (the heap grows instead, and a freed block stays in it for the next request);
  // the heap's free top is returned to the system only beyond 2 GiB (mallopt takes an int).
  if (mallopt(M_MMAP_MAX, 0) != 1 || mallopt(M_TRIM_THRESHOLD, INT_MAX) != 1) return "";
  return "malloc keeps freed memory for reuse (no mmap per large tensor; GLIBC_TUNABLES=glibc.malloc.* overrides)";
#else
  return "";
#endif
}

}  // namespace archspace
