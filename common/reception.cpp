#include "reception.hpp"

namespace common {

std::string OverLimits(const Options& options, const wire::Transfer& t, uint64_t requests,
                       uint64_t client_bytes, uint64_t all_bytes) {
  const uint64_t bytes = t.pages.size() * t.page_size;
  if (requests >= options.max_requests)
    return std::to_string(requests) + " requests in flight already (--max-requests " +
           std::to_string(options.max_requests) + ")";
  if (client_bytes + bytes > options.client_memory)
    return "its requests would hold " + std::to_string(client_bytes + bytes) +
           " bytes of source memory, over this server's " + std::to_string(options.client_memory) +
           " per client (--client-memory)";
  if (all_bytes + bytes > options.server_memory)
    return "the server's requests would hold " + std::to_string(all_bytes + bytes) +
           " bytes of source memory, over its " + std::to_string(options.server_memory) +
           " for all clients (--server-memory)";
  return "";
}

}  // namespace common
