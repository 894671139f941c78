// Reading a whole file, with errors that name it (a directory, a missing file, a read failure) rather than
// iostream's text ("basic_filebuf::underflow error reading the file").
#pragma once

#include <string>

namespace archspace {

// The file's bytes. Throws archspace::Error "PATH: cannot open (...)" or "PATH: is a directory, not a file".
std::string read_text_file(const std::string& path);

// Throws the same errors as read_text_file when `path` cannot be read as a file (for streaming readers).
void check_readable_file(const std::string& path);

}  // namespace archspace
