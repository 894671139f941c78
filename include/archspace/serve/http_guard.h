// What cpp-httplib 0.11 (Debian's, compiled: its macros cannot be changed) leaves open, closed in front of
// it: GuardedServer reads each connection through its own stream, which
//   - bounds the request line and headers together (bytes and lines), so a flood of headers is refused
//     after max_header_bytes instead of kept;
//   - bounds the body whatever its transfer encoding (httplib caps only a Content-Length body);
//   - refuses, with 400 and a closed connection, header lines without a colon (httplib skips them),
//     conflicting or malformed Content-Lengths (httplib takes the first), Transfer-Encoding with
//     Content-Length or other than chunked (request smuggling behind a proxy);
//   - ignores Range (httplib would answer API routes with byte ranges);
//   - still answers a client that half-closed its side after sending (httplib's writability check reads
//     the peer's EOF as a dead connection).
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace archspace::serve {

struct HttpLimits {
  int64_t max_header_bytes = 64 << 10;  // request line and headers
  int64_t max_header_lines = 128;
  int64_t max_body_bytes = 16 << 20;  // as received (chunk framing included)
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(HttpLimits limits) : limits_(limits) {}
  // Why the request on this thread's connection is refused ("" when it is not): the pre-routing and error
  // handlers answer it (400, 413 or 431) with this message and the connection closes after.
  static const std::string& refusal();
  static int refusal_status();
  // When the first byte of the request on this thread's connection arrived.
  static std::chrono::steady_clock::time_point request_start();
  // A check of this thread's connection for Ticket::set_client_check (it runs on the scheduler's thread
  // while this one waits): true once the client reset the connection or closed it both ways. An EOF alone
  // may be a half-close (a client still reading its answer), so with `probe` (HTTP/1.1, whose clients must
  // parse 1xx responses, RFC 9110 section 15.2) the check answers an EOF with one interim
  // "HTTP/1.1 100 Continue": a peer that closed entirely answers it with a reset, seen at the next check;
  // a half-closed one reads it, then the answer. Without `probe` (HTTP/1.0 clients, which must not get
  // 1xx, or a stream this thread writes itself) an EOF is not taken for a departure. Valid until the
  // handler returns: clear it from the ticket before.
  static std::function<bool()> client_check(bool probe);

 private:
  bool process_and_close_socket(socket_t sock) override;
  HttpLimits limits_;
};

}  // namespace archspace::serve
