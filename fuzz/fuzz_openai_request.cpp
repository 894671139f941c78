// libFuzzer target: the OpenAI request parsing of `serve` (serve/openai_schema) on raw bodies, for the four
// POST routes (the first byte picks one), over the micro preset's dolma2 vocabulary. An ApiError is the
// expected answer to bad input; anything else escaping (a crash, a nlohmann type_error, a stack overflow on
// deep JSON) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "archspace/config/model_config.h"
#include "archspace/serve/openai_schema.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"

using namespace archspace;

static std::shared_ptr<const Tokenizer> tokenizer;
static ModelConfig config;
static serve::ServedModel* model;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  try {
    tokenizer = Tokenizer::load("dolma2");
    config = preset("micro");
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_openai_request: %s\n", e.what());
    std::exit(1);
  }
  model = new serve::ServedModel{"m", config, *tokenizer, {100257}, {100257, 100265}, {}};
  model->limits.max_prompt_tokens = 4096;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const serve::Json j = serve::parse_body(body);
    switch (data[0] % 4) {
      case 0: {
        const auto r = serve::parse_completion_request(j, *model);
        (void)serve::completion_sequences(r, *model);
        break;
      }
      case 1: {
        const auto r = serve::parse_chat_request(j, *model);
        (void)serve::chat_sequences(r, *model);
        break;
      }
      case 2:
        (void)serve::tokenize_response(j, *model);
        break;
      default:
        (void)serve::detokenize_response(j, *model);
    }
  } catch (const serve::ApiError&) {
  }
  return 0;
}
