// Python's str semantics where evaluation metrics depend on them (lm-eval and OLMES compute in Python):
// str.lower and str.capitalize (Python's full case mappings and its final-sigma rule, from the tables
// scripts/python_case_tables.py reads from Python), str.isspace/strip/split, string.punctuation, float() and
// repr(float).
#pragma once

#include <string>
#include <vector>

namespace archspace::text {

bool py_isspace(char32_t c);                                    // str.isspace of one character
std::string py_lower(const std::string& s);                     // str.lower
std::string py_capitalize(const std::string& s);                // str.capitalize
std::string py_strip(const std::string& s);                     // str.strip()
std::string py_lstrip(const std::string& s);                    // str.lstrip()
std::string py_rstrip(const std::string& s);                    // str.rstrip()
std::vector<std::string> py_split(const std::string& s);        // str.split()
std::string join_words(const std::vector<std::string>& words);  // " ".join(words)

extern const std::string kPyPunctuation;               // string.punctuation
std::string remove_punctuation(const std::string& s);  // the characters of string.punctuation dropped

// s with every occurrence of `from` (not empty) replaced by `to`, left to right (str.replace).
void replace_all(std::string& s, const std::string& from, const std::string& to);

bool py_is_float(const std::string& s);           // float(s) succeeds
std::string py_float_repr(const std::string& s);  // str(float(s)); s must satisfy py_is_float

}  // namespace archspace::text
