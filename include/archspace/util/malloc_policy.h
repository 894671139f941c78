// How the C library's malloc treats the large tensors a training step allocates and frees every step.
//
// LibTorch's CPU allocator is posix_memalign. glibc serves every block above its mmap threshold (at most
// 32 MB) with a fresh mmap and unmaps it at free, so the next step's block of the same size starts as
// untouched pages: the kernel zeroes and maps each 4 KB page on first touch. In a bf16 training step of the
// 190M preset that cost ~0.5 s of a ~2.5 s step in the embedding gradient alone (aten::zeros of a fresh
// [100,278 x 768] fp32 tensor at 0.6 GB/s). Keeping freed blocks in the heap for reuse, as PyTorch's
// caching allocators do on GPUs (and jemalloc/tcmalloc, which Intel recommends for PyTorch on CPUs), removes
// that: the memory is reused already mapped. The price is that the process keeps its peak memory until it
// exits, which a training run reaches every step anyway.
#pragma once

#include <string>

namespace archspace {

// Large tensors (2 MB and more: weights, KV caches, activations) on transparent huge pages, through LibTorch's own
// switch (THP_MEM_ALLOC_ENABLE=1: its CPU allocator madvises such blocks MADV_HUGEPAGE). Decoding reads every weight
// from memory each token; with 4 KB pages the 1B's bf16 step read 32-45 GB/s, with 2 MB pages 47-49
// (bench_linear --preset 1B --dtype bf16 --shapes step, 3 alternating rounds, Zen 4, 2026-12-07), and llama.cpp,
// whose weights are a file mapping the page cache holds in huge pages, had read faster than the engine until then.
// LibTorch reads the variable once, at its first allocation, so main() calls this before anything else. Does
// nothing when the user set THP_MEM_ALLOC_ENABLE (0 turns it off) or the kernel's THP is "never". Returns what it
// did, for start-up notes ("" when nothing).
std::string use_huge_pages_for_large_tensors();

// Serves large blocks from the heap and keeps freed memory for reuse (glibc: M_MMAP_MAX = 0, M_TRIM_THRESHOLD
// = 2 GiB - 1). Does nothing when the user set glibc's malloc tunables or MALLOC_*_ variables (theirs win) or
// on another C library. Returns what it did, for the run's start-up note ("" when nothing).
std::string keep_freed_memory_for_reuse();

}  // namespace archspace
