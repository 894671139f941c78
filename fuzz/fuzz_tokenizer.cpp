// libFuzzer target: tokenizer.json (Tokenizer::load), then encode a short text and decode it.
#include <cstddef>
#include <cstdint>

#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("tokenizer.json", data, size);
  try {
    auto tokenizer = archspace::Tokenizer::load(path);
    const auto ids = tokenizer->encode("Hello world! <|endoftext|> 12345  \n\t caf\xc3\xa9 \xf0\x9f\x98\x80");
    (void)tokenizer->decode(ids);
    (void)tokenizer->decode(ids, /*skip_special_tokens=*/true);
    for (uint32_t id = 0; id < 8 && id < tokenizer->vocab_size(); ++id) (void)tokenizer->id_to_token(id);
  } catch (const archspace::Error&) {
  }
  return 0;
}
