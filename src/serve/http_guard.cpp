#include "archspace/serve/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

namespace archspace::serve {

namespace {

// The refusal of the request being handled on this thread (httplib runs a connection's requests, handlers
// included, on one thread).
thread_local std::string t_refusal;
thread_local int t_refusal_status = 0;
thread_local int t_socket = -1;  // the connection being served on this thread
thread_local std::chrono::steady_clock::time_point t_request_start;

void refuse(int status, std::string message) {
  if (!t_refusal.empty()) return;  // the first reason found
  t_refusal = std::move(message);
  t_refusal_status = status;
}

bool poll_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int r = 0;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return;
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  ip = host;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The request line and headers as received, checked where httplib is lenient.
void check_head(std::string_view head, const HttpLimits& limits) {
  size_t start = head.find("\r\n");
  if (start == std::string_view::npos) return;  // httplib refuses it itself
  start += 2;
  int64_t lines = 0;
  std::vector<std::string> lengths;
  std::vector<std::string> encodings;
  while (start < head.size()) {
    size_t end = head.find("\r\n", start);
    if (end == std::string_view::npos) end = head.size();
    const std::string_view line = head.substr(start, end - start);
    start = end + 2;
    if (line.empty()) break;  // the end of the headers
    const std::string which = "header line " + std::to_string(++lines);
    if (lines > limits.max_header_lines) {
      return refuse(431, "more than " + std::to_string(limits.max_header_lines) + " header lines (--max-header-lines)");
    }
    if (line.find_first_of("\r\n") != std::string_view::npos)
      return refuse(400, which + " holds a bare CR or LF (lines end with CRLF)");
    if (line.front() == ' ' || line.front() == '\t')
      return refuse(400, which + " is a folded continuation line (obsolete; not accepted)");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return refuse(400, which + " is not 'Name: value' (no colon)");
    const std::string_view name = line.substr(0, colon);
    if (name.find_first_of(" \t") != std::string_view::npos)
      return refuse(400, which + ": whitespace before the colon of the field name");
    const std::string key = lower(name);
    const std::string_view value = trim(line.substr(colon + 1));
    if (key == "content-length") {
      size_t from = 0;  // "5, 5" is one length said twice; each item must be digits
      while (true) {
        const size_t comma = value.find(',', from);
        const std::string_view item = trim(value.substr(from, comma == std::string_view::npos ? comma : comma - from));
        if (item.empty() || item.size() > 18 || !std::all_of(item.begin(), item.end(), ::isdigit))
          return refuse(400, "Content-Length '" + std::string(value.substr(0, 40)) + "' is not a length");
        lengths.emplace_back(item);
        if (comma == std::string_view::npos) break;
        from = comma + 1;
      }
    } else if (key == "transfer-encoding") {
      encodings.push_back(lower(value));
    }
  }
  for (const auto& l : lengths) {
    if (std::stoull(l) != std::stoull(lengths[0]))
      return refuse(400, "conflicting Content-Length headers (" + lengths[0] + " and " + l + ")");
  }
  if (!encodings.empty() && !lengths.empty())
    return refuse(400, "Transfer-Encoding together with Content-Length (ambiguous framing; send one)");
  if (!encodings.empty() && !(encodings.size() == 1 && encodings[0] == "chunked"))
    return refuse(400, "Transfer-Encoding other than 'chunked' is not accepted");
}

class GuardedStream final : public httplib::Stream {
 public:
  GuardedStream(int fd, const HttpLimits& limits, time_t read_timeout_sec, time_t write_timeout_sec)
      : fd_(fd),
        limits_(limits),
        read_ms_(static_cast<int>(read_timeout_sec * 1000)),
        write_ms_(static_cast<int>(write_timeout_sec * 1000)) {}

  bool is_readable() const override { return pos_ < buf_.size() || poll_fd(fd_, POLLIN, read_ms_); }
  // The socket takes bytes; not also "the peer sent no EOF", as httplib's stream asks, so that a client
  // that half-closed after its request still reads the answer.
  bool is_writable() const override { return poll_fd(fd_, POLLOUT, write_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    const int64_t used = in_head_ ? static_cast<int64_t>(head_.size()) : body_bytes_;
    const int64_t room = (in_head_ ? limits_.max_header_bytes : limits_.max_body_bytes) - used;
    if (room <= 0) {
      if (in_head_) {
        refuse(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) +
                        " bytes (--max-header-bytes)");
      } else {
        refuse(413, "the request body exceeds " + std::to_string(limits_.max_body_bytes) +
                        " bytes, whatever its transfer encoding (--max-body-bytes)");
      }
      return -1;
    }
    size = std::min<size_t>(size, static_cast<size_t>(room));
    if (pos_ == buf_.size()) {
      if (!poll_fd(fd_, POLLIN, read_ms_)) return -1;
      buf_.resize(16 << 10);
      pos_ = 0;
      ssize_t n = 0;
      do {
        n = ::recv(fd_, buf_.data(), buf_.size(), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) {
        buf_.clear();
        return n;
      }
      buf_.resize(static_cast<size_t>(n));
    }
    const size_t n = std::min(size, buf_.size() - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    if (in_head_) {
      head_.append(ptr, n);
    } else {
      body_bytes_ += static_cast<int64_t>(n);
    }
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n = 0;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // Waits up to `seconds` for the next request's first byte; false when none comes or the server stops.
  bool wait_for_request(time_t seconds, const std::atomic<socket_t>& server) const {
    if (pos_ < buf_.size()) return true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (server != INVALID_SOCKET) {
      if (poll_fd(fd_, POLLIN, 10)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
    return false;
  }

  void begin_request() {
    t_request_start = std::chrono::steady_clock::now();
    in_head_ = true;
    head_.clear();
    body_bytes_ = 0;
    t_refusal.clear();
    t_refusal_status = 0;
  }

  // httplib parsed the headers: check them as received; the body is counted from here.
  void end_head(httplib::Request& req) {
    in_head_ = false;
    check_head(head_, limits_);
    req.ranges.clear();  // no byte ranges of API replies
    head_.clear();
    head_.shrink_to_fit();
  }

 private:
  int fd_;
  HttpLimits limits_;
  int read_ms_, write_ms_;
  std::string buf_;
  size_t pos_ = 0;
  bool in_head_ = false;
  std::string head_;
  int64_t body_bytes_ = 0;
};

// Closes after a refusal without resetting the connection under the answer: stop sending, read (and drop)
// what the client still sends for a moment, then close.
void close_gently(int fd) {
  ::shutdown(fd, SHUT_WR);
  char sink[16 << 10];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int64_t drained = 0;
  while (drained < (4 << 20) && std::chrono::steady_clock::now() < until && poll_fd(fd, POLLIN, 100)) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n <= 0) break;
    drained += n;
  }
}

}  // namespace

std::function<bool()> GuardedServer::client_check(bool probe) {
  const int fd = t_socket;
  if (fd < 0) return nullptr;
  return [fd, probe, probed = false]() mutable {
    pollfd p{fd, POLLRDHUP, 0};  // POLLERR and POLLHUP (a reset, or both ways closed) come unasked
    if (::poll(&p, 1, 0) <= 0) return false;
    if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return true;
    if ((p.revents & POLLRDHUP) == 0 || !probe || probed) return false;
    // The peer sent FIN: closed, or only half-closed? Only a closed socket answers data with a reset.
    static constexpr char kProbe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ssize_t n = 0;
    do {
      n = ::send(fd, kProbe, sizeof(kProbe) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;  // EAGAIN: nothing sent, try at the next check
    probed = true;
    for (size_t sent = static_cast<size_t>(n); sent < sizeof(kProbe) - 1; sent += static_cast<size_t>(n)) {
      do {  // the send buffer was empty (nothing else is written while the request waits): rare, short
        n = ::send(fd, kProbe + sent, sizeof(kProbe) - 1 - sent, MSG_NOSIGNAL);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return true;
    }
    return false;
  };
}

const std::string& GuardedServer::refusal() { return t_refusal; }
int GuardedServer::refusal_status() { return t_refusal_status; }
std::chrono::steady_clock::time_point GuardedServer::request_start() { return t_request_start; }

bool GuardedServer::process_and_close_socket(socket_t sock) {
  bool ret = false, refused = false;
  t_socket = sock;
  {
    GuardedStream strm(sock, limits_, read_timeout_sec_, write_timeout_sec_);
    for (size_t count = keep_alive_max_count_; count > 0; --count) {
      if (!strm.wait_for_request(keep_alive_timeout_sec_, svr_sock_)) break;
      strm.begin_request();
      bool closed = false;
      ret = process_request(strm, count == 1, closed, [&](httplib::Request& req) { strm.end_head(req); });
      refused = !t_refusal.empty();
      if (!ret || closed || refused) break;
    }
  }
  if (refused) close_gently(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  t_socket = -1;
  t_refusal.clear();
  return ret;
}

}  // namespace archspace::serve
