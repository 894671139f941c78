#include "archspace/util/malloc_policy.h"

#include <climits>
#include <cstdlib>
#include <cstring>

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
