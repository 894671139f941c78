#include "archspace/util/error_message.h"

#include <c10/util/Exception.h>

namespace archspace {

std::string error_message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace archspace
