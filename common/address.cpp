#include "address.hpp"
#include "report.hpp"

#include "error.hpp"
#include "oob.hpp"

#include <netinet/in.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace common {

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  return hex;
}

static int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::vector<uint8_t> FromHex(std::string_view hex) {
  const std::string shown(hex.substr(0, 80));
  if (hex.empty()) throw UsageError("address is empty");
  for (size_t i = 0; i < hex.size(); ++i) {
    if (HexValue(hex[i]) < 0)
      throw UsageError("address '" + shown + "' is not hex (character " + std::to_string(i + 1) +
                       ")");
  }
  if (hex.size() % 2 != 0)
    throw UsageError("address '" + shown + "' has an odd number of hex digits (" +
                     std::to_string(hex.size()) + ")");
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(HexValue(hex[2 * i]) << 4 | HexValue(hex[2 * i + 1]));
  return bytes;
}

std::optional<size_t> AddressLength(uint32_t addr_format) {
  switch (addr_format) {
    case FI_SOCKADDR_IN:
      return sizeof(sockaddr_in);
    case FI_SOCKADDR_IN6:
      return sizeof(sockaddr_in6);
    case FI_ADDR_EFA:
      return 32;  // GID (16) + QPN (2) + pad (2) + QKEY (4) + pad (8)
    default:
      return std::nullopt;
  }
}

const char* AddressFormatName(uint32_t addr_format) {
  switch (addr_format) {
    case FI_SOCKADDR_IN:
      return "FI_SOCKADDR_IN";
    case FI_SOCKADDR_IN6:
      return "FI_SOCKADDR_IN6";
    case FI_ADDR_EFA:
      return "FI_ADDR_EFA";
    case FI_ADDR_STR:
      return "FI_ADDR_STR";
    default:
      return "provider-specific";
  }
}

void CheckAddress(std::span<const uint8_t> address, const fi_info& info) {
  const std::string provider = info.fabric_attr->prov_name;
  if (auto want = AddressLength(info.addr_format)) {
    if (address.size() != *want)
      throw UsageError("address has " + std::to_string(address.size()) + " bytes, but " + provider +
                       " addresses (" + AddressFormatName(info.addr_format) + ") have " +
                       std::to_string(*want));
    // A socket address starts with its family; another family would confuse the provider.
    sa_family_t family = 0;
    if (info.addr_format == FI_SOCKADDR_IN || info.addr_format == FI_SOCKADDR_IN6)
      std::memcpy(&family, address.data(), sizeof(family));
    if ((info.addr_format == FI_SOCKADDR_IN && family != AF_INET) ||
        (info.addr_format == FI_SOCKADDR_IN6 && family != AF_INET6))
      throw UsageError("address " + ToHex(address) + " is not a " + provider + " address (" +
                       AddressFormatName(info.addr_format) + " of another family)");
    return;
  }
  if (info.addr_format == FI_ADDR_STR) {
    // A name such as "fi_shm://1234": printable characters ending in one NUL.
    bool printable = address.size() >= 2 && address.back() == 0;
    for (size_t i = 0; printable && i + 1 < address.size(); ++i)
      printable = address[i] >= 0x20 && address[i] < 0x7f;
    if (!printable)
      throw UsageError("address " + ToHex(address).substr(0, 80) + " is not a " + provider +
                       " address (a NUL-terminated name such as fi_shm://1234)");
    // An shm name is a file of /dev/shm that its endpoint created. Over libfabric 1.17, 254
    // CONNECTs naming files nobody created filled a server's AV (shm's holds 256) although
    // it removed all but 193 of them (HostileOverShm.KilledClientThenManyNewAddresses): such a name
    // is refused here, before it reaches the AV.
    const std::string file = ShmFileOf(address, info);
    struct stat st {};
    if (!file.empty() && stat(file.c_str(), &st) != 0)
      throw Error("no shm endpoint is named " +
                  std::string(reinterpret_cast<const char*>(address.data()), address.size() - 1) +
                  " (no " + file + "): is that server or peer running?");
  }
}

std::vector<uint8_t> CanonicalAddress(std::span<const uint8_t> address, uint32_t addr_format) {
  std::vector<uint8_t> bytes(address.begin(), address.end());
  sa_family_t family = 0;
  if (bytes.size() >= sizeof(family)) std::memcpy(&family, bytes.data(), sizeof(family));
  if (family == AF_INET && bytes.size() == sizeof(sockaddr_in) &&
      (addr_format == FI_SOCKADDR_IN || addr_format == FI_SOCKADDR)) {
    sockaddr_in in{};
    std::memcpy(&in, bytes.data(), sizeof(in));
    sockaddr_in canonical{};
    canonical.sin_family = AF_INET;
    canonical.sin_port = in.sin_port;
    canonical.sin_addr = in.sin_addr;
    std::memcpy(bytes.data(), &canonical, sizeof(canonical));
    return bytes;
  }
  if (family == AF_INET6 && bytes.size() == sizeof(sockaddr_in6) &&
      (addr_format == FI_SOCKADDR_IN6 || addr_format == FI_SOCKADDR)) {
    sockaddr_in6 in6{};
    std::memcpy(&in6, bytes.data(), sizeof(in6));
    in6.sin6_flowinfo = 0;
    std::memcpy(bytes.data(), &in6, sizeof(in6));
    return bytes;
  }
  if (addr_format == FI_ADDR_EFA && bytes.size() == 32) {
    std::fill(bytes.begin() + 18, bytes.begin() + 20, 0);  // pad
    std::fill(bytes.begin() + 24, bytes.end(), 0);         // the provider's own pointer
    return bytes;
  }
  if (addr_format == FI_ADDR_STR) {
    std::string name(reinterpret_cast<const char*>(bytes.data()),
                     std::find(bytes.begin(), bytes.end(), 0) - bytes.begin());
    if (const size_t scheme = name.find("://"); scheme != std::string::npos)
      name.erase(0, scheme + 3);
    name.resize(std::min<size_t>(name.size(), 256));
    return {name.begin(), name.end()};
  }
  return bytes;
}

std::string ShmFileOf(std::span<const uint8_t> address, const fi_info& info) {
  constexpr std::string_view kPrefix = "fi_shm://";
  if (std::string(info.fabric_attr->prov_name) != "shm" || address.size() < 2 ||
      address.back() != 0)
    return "";
  const std::string name(reinterpret_cast<const char*>(address.data()), address.size() - 1);
  if (name.rfind(kPrefix, 0) != 0 || name.find('/', kPrefix.size()) != std::string::npos ||
      name.size() == kPrefix.size())
    return "";
  return "/dev/shm/" + name.substr(kPrefix.size());
}

// Writes `text` and a newline to `path`, all of it or nothing: on failure, a UsageError that
// says why. A new or regular file is written under a temporary name and renamed, so a reader
// never sees half of it; anything else (a pipe, /dev/stdout, a device) is written in place,
// never replaced by a file.
static void WriteAtomically(const std::string& text, const std::string& path) {
  auto fail = [&](int err) {
    throw UsageError("cannot write address file '" + path + "': " + std::strerror(err));
  };
  struct stat st {};
  const bool special = stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  const std::string target = special ? path : path + ".tmp";
  FILE* out = std::fopen(target.c_str(), "w");
  if (out == nullptr) fail(errno);
  const bool written = std::fprintf(out, "%s\n", text.c_str()) >= 0 && std::fflush(out) == 0;
  const int err = errno;
  if (std::fclose(out) != 0 || !written) {
    if (!special) std::remove(target.c_str());
    fail(written ? errno : err);
  }
  if (!special && std::rename(target.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(target.c_str());
    fail(rename_err);
  }
}

void PublishAddress(std::span<const uint8_t> address, const Options& options) {
  const std::string hex = ToHex(address);
  if (options.oob_port != 0) ServeAddressOnPort(hex, options.oob_port);  // exit 2 before "addr:"
  FILE* out = EssentialOut();  // printed at every output level: the user needs it
  std::fprintf(out, "addr: %s\n", hex.c_str());
  if (options.oob_port != 0)
    std::fprintf(out, "oob: the address is given on TCP port %u\n", options.oob_port);
  std::fflush(out);
  if (!options.address_file.empty()) WriteAtomically(hex, options.address_file);
}

void WriteAddressList(const std::vector<std::vector<uint8_t>>& addresses, const std::string& path) {
  std::string text;
  for (const auto& a : addresses) text += (text.empty() ? "" : ",") + ToHex(a);
  WriteAtomically(text, path);
}

std::vector<std::vector<uint8_t>> ReadAddressList(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) throw UsageError("cannot read address file '" + path + "'");
  std::vector<std::vector<uint8_t>> addresses;
  for (size_t start = 0; start <= line.size();) {
    const size_t end = std::min(line.find(',', start), line.size());
    addresses.push_back(FromHex(line.substr(start, end - start)));
    start = end + 1;
  }
  return addresses;
}

}  // namespace common
