// HttpServer — the agent endpoint's HTTP layer: cpp-httplib (Debian's libcpp-httplib)
// bound to one interface and port, serving on its own threads until destroyed. It checks
// what every request must have and hands the rest to one handler:
//   - the job's bearer token, as OpenAI clients send it (Authorization: Bearer <token>) or
//     as Anthropic clients do (x-api-key: <token>); otherwise 401;
//   - a body of at most max_body_bytes; otherwise 413;
//   - a path /s/<session>/v1/<route> (the base URL an agent is given names its session)
//     or /v1/<route>; otherwise 404.
// Error statuses that httplib sets itself get an OpenAI-style error object too.
// The handler runs on the server's threads (up to `threads` requests at once; a request
// may wait there for the model's turn), so it must be thread-safe. Owned by the
// environment that serves the sessions (agent/agent_environment.h); httplib stays out of
// this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace slimpi {

struct HttpRequest {
  std::string method;   // "GET", "POST"
  std::string session;  // "" for /v1/... paths
  std::string route;    // the path after /v1/: "chat/completions", "models", ...
  std::string body;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;
  // Binds host:port (port 0: one the system picks) and starts serving; throws
  // slimpi::Error naming the address when it cannot bind.
  HttpServer(const std::string& host, int port, std::string token, int64_t max_body_bytes, int threads,
             Handler handler);
  ~HttpServer();  // stops accepting, waits for the requests being served (the handler must let them end)
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slimpi
