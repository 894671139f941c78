#include "archspace/util/gzip_lines.h"

#include <zlib.h>

#include <cstring>

#include "archspace/util/error.h"
#include "archspace/util/files.h"

namespace archspace {

namespace {

std::string bytes_text(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// Closes the file on every way out; for_each_gzip_line closes a stream it read to the end itself, to check it.
struct GzipFile {
  gzFile f = nullptr;
  ~GzipFile() {
    if (f) gzclose(f);
  }
  std::string error() {
    int code = 0;
    return gzerror(f, &code);
  }
};

}  // namespace

int64_t for_each_gzip_line(const std::string& path, const GzipLineLimits& limits,
                           const std::function<bool(const std::string&, int64_t)>& fn) {
  check_readable_file(path);
  GzipFile file{gzopen(path.c_str(), "rb")};
  if (!file.f) throw Error(path + ": cannot open");
  std::string line;
  int64_t line_number = 0;
  uint64_t total = 0;
  // Hands the line to fn; false when fn asked to stop.
  const auto finish_line = [&]() {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool more = fn(line, line_number);
    line.clear();
    return more;
  };
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(file.f, buffer, sizeof(buffer));
    if (n < 0) throw Error(path + ": corrupt gzip file (" + file.error() + ")");
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
    if (total > limits.max_total_bytes)
      throw Error(path + ": decompresses to more than " + bytes_text(limits.max_total_bytes) +
                  " (the limit for this kind of file)");
    for (const char* p = buffer; p < buffer + n;) {
      const char* end = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(buffer + n - p)));
      const size_t length = static_cast<size_t>((end ? end : buffer + n) - p);
      if (line.size() + length > limits.max_line_bytes)
        throw Error(path + ":" + std::to_string(line_number + 1) + ": line longer than " +
                    bytes_text(limits.max_line_bytes));
      line.append(p, length);
      if (!end) break;
      if (!finish_line()) return line_number;  // stopped early: the rest of the stream is not read or checked
      p = end + 1;
    }
  }
  // A stream cut short ends as if complete, its last line cut: report that before handing that line on.
  int code = Z_OK;
  gzerror(file.f, &code);
  if (code == Z_BUF_ERROR) throw Error(path + ": corrupt gzip file (truncated stream)");
  if (!line.empty() && !finish_line()) return line_number;
  const int closed = gzclose(file.f);
  file.f = nullptr;
  if (closed != Z_OK) throw Error(path + ": corrupt gzip file (truncated stream)");
  return line_number;
}

}  // namespace archspace
