#include "nic_counters.hpp"

#include <filesystem>
#include <fstream>

namespace common {

namespace fs = std::filesystem;

namespace {

std::optional<uint64_t> ReadCounter(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// efa names its domains after the device: rdmap79s0-rdm (RDM), rdmap79s0-dgrm.
std::string DeviceOf(std::string domain) {
  for (const std::string suffix : {"-rdm", "-dgrm"})
    if (domain.size() > suffix.size() &&
        domain.compare(domain.size() - suffix.size(), std::string::npos, suffix) == 0)
      domain.resize(domain.size() - suffix.size());
  return domain;
}

std::optional<std::string> FirstWord(const fs::path& path) {
  std::ifstream in(path);
  std::string word;
  if (!std::getline(in, word)) return std::nullopt;
  return word;
}

}  // namespace

std::optional<bool> LinkUp(const std::string& domain, const std::string& root) {
  // efa: "4: ACTIVE" when the port carries traffic; "1: DOWN", "2: INIT", ... when not.
  if (const auto state =
          FirstWord(fs::path(root) / "sys/class/infiniband" / DeviceOf(domain) / "ports/1/state"))
    return state->find("ACTIVE") != std::string::npos;
  // A netdev (RFC 2863 states): "up"; "down", "lowerlayerdown", "dormant", ... are not.
  const auto operstate = FirstWord(fs::path(root) / "sys/class/net" / domain / "operstate");
  if (!operstate || *operstate == "unknown") return std::nullopt;
  return *operstate == "up";
}

std::string WireCounterPath(const std::string& domain, WireDirection direction,
                            const std::string& root) {
  const bool sent = direction == WireDirection::kSent;
  const std::string device = DeviceOf(domain);
  const char* counter = sent ? "rdma_write_bytes" : "rdma_write_recv_bytes";
  if (direction == WireDirection::kRetransmitted) counter = "retrans_bytes";
  const fs::path efa =
      fs::path(root) / "sys/class/infiniband" / device / "ports/1/hw_counters" / counter;
  std::error_code ec;
  if (fs::exists(efa, ec)) return efa.string();
  if (direction == WireDirection::kRetransmitted) return "";
  const fs::path net =
      fs::path(root) / "sys/class/net" / domain / "statistics" / (sent ? "tx_bytes" : "rx_bytes");
  if (fs::exists(net, ec)) return net.string();
  return "";
}

bool CountsDeviceWrites(const std::string& domain, const std::string& root) {
  return WireCounterPath(domain, WireDirection::kReceived, root).find("/hw_counters/") !=
         std::string::npos;
}

WireBytes::WireBytes(const std::vector<std::string>& domains, WireDirection direction,
                     const std::string& root) {
  for (const auto& d : domains)
    if (const std::string path = WireCounterPath(d, direction, root); !path.empty())
      paths_[d] = path;
}

void WireBytes::Start() {
  for (const auto& [domain, path] : paths_) start_[domain] = ReadCounter(path).value_or(0);
}

std::map<std::string, uint64_t> WireBytes::Bytes() const {
  std::map<std::string, uint64_t> bytes;
  for (const auto& [domain, path] : paths_) {
    const auto now = ReadCounter(path);
    const auto start = start_.find(domain);
    if (now && start != start_.end() && *now >= start->second) bytes[domain] = *now - start->second;
  }
  return bytes;
}

}  // namespace common
