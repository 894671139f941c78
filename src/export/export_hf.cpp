#include "archspace/export/export_hf.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archspace/chat/chat.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/remote_code.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  if (!out) throw Error(p.string() + ": write failed");
}

// SPEC.md section 6 as a Jinja chat template: what encode_chat produces (a finished conversation ends in
// <|endoftext|>), or with a generation prompt what encode_chat_prompt produces (every turn ends in <|im_end|>).
std::string chat_template() {
  return std::string("{%- if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n") + kDefaultSystemPrompt +
         "<|im_end|>\\n' }}{%- endif %}"
         "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
         "{%- if loop.last and message['role'] == 'assistant' and not add_generation_prompt %}{{ '<|endoftext|>' }}{%- "
         "else %}{{ '<|im_end|>\\n' "
         "}}{%- endif %}"
         "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace

void export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options) {
  const std::string model_dir = resolve_model_dir(checkpoint);
  if (const std::string ckpt = checkpoint_of_model_dir(model_dir); !ckpt.empty()) verify_checkpoint(ckpt);
  CausalLM model = load_model(model_dir);
  const ModelConfig& c = model.config();
  // The one tokenizer rule; an HF directory needs a tokenizer, so export ships dolma2 when nothing says otherwise.
  auto tokenizer = model_tokenizer(model_dir, options.tokenizer, c.vocab_size, "dolma2");
  if (fs::exists(out_dir) && !fs::is_empty(out_dir)) throw Error(out_dir + ": exists and is not empty");
  fs::create_directories(out_dir);
  const fs::path out(out_dir);

  save_model(model, out_dir, options.dtype);
  fs::copy_file(tokenizer->path(), out / "tokenizer.json", fs::copy_options::overwrite_existing);
  auto token_or_null = [&](const char* t) { return tokenizer->token_to_id(t) ? json(t) : json(nullptr); };
  json tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},  {"eos_token", token_or_null("<|endoftext|>")},
                     {"pad_token", token_or_null("<|pad|>")},         {"bos_token", nullptr},
                     {"model_max_length", c.max_position_embeddings}, {"clean_up_tokenization_spaces", false}};
  if (tokenizer->token_to_id("<|im_start|>")) tok_config["chat_template"] = chat_template();
  write_file(out / "tokenizer_config.json", tok_config.dump(2) + "\n");
  json gen = {{"eos_token_id", c.eos_token_id ? json(*c.eos_token_id) : json(nullptr)},
              {"pad_token_id", c.pad_token_id ? json(*c.pad_token_id) : json(nullptr)}};
  write_file(out / "generation_config.json", gen.dump(2) + "\n");
  if (c.variant == Variant::kSiameseDepth) {
    write_file(out / "configuration_olmo3_siamese_depth.py", kRemoteConfigurationPy);
    write_file(out / "modeling_olmo3_siamese_depth.py", kRemoteModelingPy);
  }
}

}  // namespace archspace
