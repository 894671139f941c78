#include "archspace/util/file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "archspace/util/error.h"

namespace archspace {

std::string file_error(const std::string& path, const std::string& what, int err) {
  return path + ": " + what + ": " + std::strerror(err);
}

FileWriter::FileWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(file_error(path_, "cannot open for writing", errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) throw Error(path_ + ": write after the file was closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // write(2) may write less than asked (a signal, a filesystem's limit per call); a full disk gives ENOSPC at the
    // first byte that does not fit (or a short write and ENOSPC at the next call).
    const ssize_t wrote = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw Error(file_error(path_, "write failed", errno));
    }
    if (wrote == 0) throw Error(file_error(path_, "write failed", EIO));
    p += wrote;
    n -= static_cast<size_t>(wrote);
  }
}

void FileWriter::finish() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(file_error(path_, "sync failed", err));
  }
  if (::close(fd) != 0) throw Error(file_error(path_, "close failed", errno));
}

void write_file(const std::string& path, std::string_view bytes) {
  FileWriter out(path);
  out.write(bytes);
  out.finish();
}

void copy_file_contents(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Error(file_error(from, "cannot open for reading", errno));
  try {
    FileWriter out(to);
    std::vector<char> buffer(size_t{1} << 20);
    for (;;) {
      const ssize_t got = ::read(in, buffer.data(), buffer.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(file_error(from, "read failed", errno));
      }
      if (got == 0) break;
      out.write(buffer.data(), static_cast<size_t>(got));
    }
    out.finish();
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

void rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw Error(file_error(to, "cannot replace it with " + from, errno));
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace archspace
