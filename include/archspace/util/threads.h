// How many CPU threads tensor ops use when the user does not say (--threads, train.threads).
//
// LibTorch's OpenMP pool spins and meets at a barrier after every op; a thread whose core is busy with
// another process stalls every barrier for a scheduler time slice. Measured on this project's 2-core
// machine with one core busy (docs/commands.md, "CPU threads"): decode of the demo model collapses with 2 threads
// and runs at full speed with 1. So the default is the number of cores idle now, not all cores.
#pragma once

namespace archspace {

// Cores this process may run on (sched_getaffinity) that were idle over a short sample of /proc/stat
// (about 50 ms), rounded, at least 1. ARCHSPACE_THREADS in the environment overrides it.
int default_thread_count();

}  // namespace archspace
