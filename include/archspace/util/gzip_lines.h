// Lines of a gzip file, streamed (a file zlib does not recognise as gzip is read as it is, as gzread does): memory
// is one 64 KiB chunk and one line, whatever the file decompresses to. Task request files (eval/tasks,
// eval/generation_tasks) and OLMo-core document metadata (data/olmo_core_tokens) are read this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace archspace {

struct GzipLineLimits {
  size_t max_line_bytes = size_t{64} << 20;  // one line, decompressed
  uint64_t max_total_bytes = UINT64_MAX;     // the whole file, decompressed (a bound against a gzip bomb)
};

// Calls fn(line, line_number) for each line (1-based; without its "\n" or a "\r" before it; a last line without
// "\n" too), until fn returns false. Returns the number of lines fn was given. Errors (archspace::Error) name the
// file, and the line where there is one: cannot open, a corrupt or truncated gzip stream, a line longer than
// limits.max_line_bytes, more than limits.max_total_bytes decompressed. An error fn throws passes through.
int64_t for_each_gzip_line(const std::string& path, const GzipLineLimits& limits,
                           const std::function<bool(const std::string& line, int64_t line_number)>& fn);

}  // namespace archspace
