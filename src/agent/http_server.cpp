#include "agent/http_server.h"

#include <httplib.h>
#include <slimpi/error.h>

#include <strings.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "agent/anthropic_messages.h"

namespace slimpi {
namespace {

// Compares in time independent of where the texts differ (a token guessed byte by byte).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

// An error object in the API the path belongs to (Anthropic's for /v1/messages).
void set_error(httplib::Response& res, const std::string& path, int status, const std::string& type,
               const std::string& code, const std::string& message) {
  res.status = status;
  const bool anthropic = path.size() >= 12 && path.compare(path.size() - 12, 12, "/v1/messages") == 0;
  res.set_content(api_error_body(api_error(status, type, code, message), anthropic), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server server;
  std::thread listener;
  int port = -1;
  int listen_fd = -1;
  std::atomic<bool> listened{false};  // listen_after_bind() has returned
};

HttpServer::HttpServer(const std::string& host, int port, std::string token, int64_t max_body_bytes, int threads,
                       Handler handler)
    : impl_(std::make_unique<Impl>()) {
  httplib::Server& s = impl_->server;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.set_payload_max_length(size_t(max_body_bytes));
  // An idle connection holds one of the threads this long. Longer than the 5 s after which
  // httpx (the openai and anthropic clients) drops an idle connection itself, so that those
  // clients never send a request on a connection the server is closing.
  s.set_keep_alive_timeout(10);
  s.set_tcp_nodelay(true);
  // httplib's listen backlog is 5, built into Debian's library: agents that connect at once
  // beyond it were reset. The socket is captured here and listened on again with a deep
  // backlog once bound (Linux takes a second listen() as the new backlog). SO_REUSEADDR
  // only: httplib's default SO_REUSEPORT would let a second listener (another rank given the
  // same rollout.agent_port) bind the port and take half of the connections.
  s.set_socket_options([impl = impl_.get()](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_fd = int(sock);
  });
  auto serve = [token, handler](const httplib::Request& req, httplib::Response& res) {
    // Either header may carry it; the scheme is case-insensitive (RFC 7235).
    const std::string auth = req.get_header_value("Authorization");
    const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "bearer ", 7) == 0;
    if (!same_secret(req.get_header_value("x-api-key"), token) && !(bearer && same_secret(auth.substr(7), token))) {
      set_error(res, req.path, 401, "invalid_request_error", "invalid_api_key",
                "no valid API key: send the job's token (OPENAI_API_KEY or ANTHROPIC_API_KEY as the agent was "
                "started with; the run directory's agent_token) as 'Authorization: Bearer <token>' or 'x-api-key'");
      return;
    }
    HttpRequest r;
    r.method = req.method;
    r.session = req.matches.size() == 3 ? std::string(req.matches[1]) : std::string();
    r.route = std::string(req.matches[req.matches.size() - 1]);
    r.body = req.body;
    HttpReply reply = handler(r);
    res.status = reply.status;
    res.set_content(reply.body, reply.content_type.c_str());
  };
  for (const char* pattern : {R"(/s/([A-Za-z0-9_-]+)/v1/(.+))", R"(/v1/(.+))"}) {
    s.Get(pattern, serve);
    s.Post(pattern, serve);
  }
  // Statuses httplib sets itself (404 for another path, 413, 400 for a malformed request)
  // get the API's error object; a handler's own errors have their body already.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string why = res.status == 404   ? "no such route: " + req.method + " " + req.path +
                                                      " (the endpoint serves /v1/chat/completions, /v1/messages and "
                                                      "/v1/models under the base URL the agent was given)"
                            : res.status == 413 ? std::string("the request body is larger than "
                                                              "rollout.agent_max_request_bytes")
                                                : std::string("the request could not be read");
    set_error(res, req.path, res.status, res.status == 404 ? "not_found_error" : "invalid_request_error",
              res.status == 413 ? "request_too_large" : "", why);
  });
  impl_->port = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (impl_->port < 0)
    SLIMPI_FAIL("the agent endpoint cannot listen on {}:{} (rollout.agent_host, rollout.agent_port): the address is "
                "in use or not this node's", host, port);
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  impl_->listener = std::thread([impl = impl_.get()] {
    impl->server.listen_after_bind();
    impl->listened = true;
  });
  // httplib's stop() does nothing before the server runs: a server destroyed at once would
  // wait forever for its listener. It runs before the constructor returns.
  while (!s.is_running() && !impl_->listened) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

HttpServer::~HttpServer() {
  impl_->server.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

int HttpServer::port() const { return impl_->port; }

}  // namespace slimpi
