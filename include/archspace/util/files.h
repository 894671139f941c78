// Reading a whole file, with errors that name it (a directory, a missing file, a read failure) rather than
// iostream's text ("basic_filebuf::underflow error reading the file"), and writing one atomically.
#pragma once

#include <string>

namespace archspace {

// The file's bytes. Throws archspace::Error "PATH: cannot open (...)" or "PATH: is a directory, not a file".
std::string read_text_file(const std::string& path);

// Throws the same errors as read_text_file when `path` cannot be read as a file (for streaming readers).
void check_readable_file(const std::string& path);

// Writes `text` to PATH.tmp and renames it over `path`: a reader, or a crash, sees the old file or the new one,
// never half of one. Throws archspace::Error naming the file and the system's reason (util/file_writer.h), leaving
// `path` as it was.
void write_text_file_atomically(const std::string& path, const std::string& text);

}  // namespace archspace
