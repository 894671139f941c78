#include "archspace/util/files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "archspace/util/error.h"
#include "archspace/util/file_writer.h"

namespace archspace {

void check_readable_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
}

std::string read_text_file(const std::string& path) {
  check_readable_file(path);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(path + ": read failed");
  return text.str();
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  try {
    write_file(tmp, text);
    rename_file(tmp, path);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace archspace
