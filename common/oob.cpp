#include "oob.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "address.hpp"
#include "error.hpp"

namespace common {
namespace {

using Clock = std::chrono::steady_clock;

// A socket bound to `port` on every interface: IPv6 with IPv4 mapped where the host has IPv6.
int Listen(uint16_t port, std::string& why) {
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int on = 1, off = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // a restart within TIME_WAIT
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      auto* a = reinterpret_cast<sockaddr_in6*>(&address);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(port);
      length = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&address);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(port);
      length = sizeof *a;
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 && listen(fd, 64) == 0)
      return fd;
    const int error = errno;
    why = std::strerror(error);
    close(fd);
    if (error == EADDRINUSE) break;  // the other family would say the same
  }
  return -1;
}

// Each connection gets the line at once, without waiting for a peer that does not read (the
// line fits any socket buffer), and is closed.
[[noreturn]] void Answer(int listener, std::string line) {
  for (;;) {
    pollfd p{listener, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    const int peer = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (peer < 0) {  // out of descriptors, or a peer that left: a moment, then on
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    [[maybe_unused]] ssize_t n = send(peer, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(peer);
  }
}

// One try: connects to an address of `host`, reads a line until `deadline`. "" and `why`
// when it could not.
std::string TryOnce(const std::string& host, uint16_t port, Clock::time_point deadline,
                    std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found)) {
    why = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return "";
  }
  std::string line;
  for (addrinfo* a = found; a != nullptr && line.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t size = sizeof error;
      connected = poll(&p, 1, 1000) == 1 &&
                  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
      if (!connected) errno = error ? error : ETIMEDOUT;
    }
    if (!connected) why = std::strerror(errno);
    std::string got;
    while (connected && got.find('\n') == std::string::npos && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) != 1) continue;
      char buffer[512];
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n <= 0) break;  // closed: what came is all
      got.append(buffer, static_cast<size_t>(n));
      if (got.size() > 4096) break;
    }
    close(fd);
    if (connected) {
      line = got.substr(0, got.find('\n'));
      if (line.empty()) why = "it connected and sent no address";
    }
  }
  freeaddrinfo(found);
  return line;
}

}  // namespace

void ServeAddressOnPort(const std::string& hex, uint16_t port) {
  std::string why;
  const int listener = Listen(port, why);
  if (listener < 0) throw UsageError("--oob-port " + std::to_string(port) + ": " + why);
  std::thread(Answer, listener, hex + "\n").detach();
}

std::string FetchAddressFrom(const std::string& host, uint16_t port, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  std::string why = "no answer";
  const std::string where = host + " port " + std::to_string(port);
  for (;;) {
    const std::string line = TryOnce(host, port, deadline, why);
    if (!line.empty()) {
      try {
        FromHex(line);  // the check every address argument gets
      } catch (const UsageError& e) {
        throw Error(where + " answered something that is not an address: '" + line.substr(0, 60) +
                    "' (" + e.what() + ")");
      }
      return line;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server is coming up
  }
  throw Error("no address from " + where + " within " + std::to_string(static_cast<int>(seconds)) +
              " s (last: " + why + "): is its server running with --oob-port " +
              std::to_string(port) + "?");
}

}  // namespace common
