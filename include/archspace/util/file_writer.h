// Writing files so that every failure names the file and the system's reason ("No space left on device", "Disk quota
// exceeded", "Read-only file system"): one path through open(2), write(2), fsync(2) and close(2) for the files a run
// must not lose (checkpoints, their pointers, model and tokenizer files, exports).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace archspace {

// "PATH: WHAT: <strerror(err)>", the form of every error below.
std::string file_error(const std::string& path, const std::string& what, int err);

// A file being written, created or truncated. Each call throws archspace::Error naming the path and the reason;
// a writer destroyed before finish() (an error path) closes its descriptor and leaves the partial file to the caller.
class FileWriter {
 public:
  explicit FileWriter(std::string path);  // "PATH: cannot open for writing: <reason>"
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);  // all n bytes, or "PATH: write failed: <reason>"
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync(2) then close(2): a full disk can show only here (delayed allocation, NFS), so it is checked like a write.
  void finish();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// `bytes` as the whole of `path`, fsynced.
void write_file(const std::string& path, std::string_view bytes);

// The bytes of `from` as `to`, fsynced: a read error names `from`, a write error `to`.
void copy_file_contents(const std::string& from, const std::string& to);

// rename(2): "TO: cannot replace it with FROM: <reason>".
void rename_file(const std::string& from, const std::string& to);

// fsync(2) of a directory, so that a rename in it survives a power cut; best effort (some filesystems refuse it).
void sync_directory(const std::string& dir);

}  // namespace archspace
