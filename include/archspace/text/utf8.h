// UTF-8 code points: what the Python string semantics (text/python_str.h) and Python `re` (text/python_re.h) walk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace archspace::text {

// The code points of `s`; a byte that does not start a complete UTF-8 sequence is kept as its own value (the
// JSON parser lets none through, so this is only a guard).
std::vector<char32_t> decode_utf8(const std::string& s);

void append_utf8(std::string& out, char32_t code_point);

std::string encode_utf8(const std::vector<char32_t>& code_points);

// Length in bytes of the UTF-8 character starting at s[i] (1 for a byte that starts none), at most s.size() - i.
size_t utf8_char_length(const std::string& s, size_t i);

// The characters of `s`, counted as the bytes that are not continuation bytes (10xxxxxx): for valid UTF-8, the
// length of the decoded string (Python's len(), what lm-eval's per-character normalisations divide by).
int64_t utf8_character_count(std::string_view s);

// Bytes at the end of `s` that may start a UTF-8 character still incomplete (0 to 3): what a stream holds back.
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace archspace::text
