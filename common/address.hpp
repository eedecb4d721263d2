// Endpoint addresses as hex text: the fi_getname blob of any provider (efa: 32 bytes,
// tcp: a sockaddr, shm: a NUL-terminated name) printed as "addr: <hex>" and typed back in.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

namespace common {

std::string ToHex(std::span<const uint8_t> bytes);

// Throws UsageError naming the text when it is empty, not hex, or of odd length.
std::vector<uint8_t> FromHex(std::string_view hex);

// The exact address length for the provider's address format, or nullopt where the
// length varies (FI_ADDR_STR names, as shm's).
std::optional<size_t> AddressLength(uint32_t addr_format);
const char* AddressFormatName(uint32_t addr_format);

// Throws UsageError unless `address` has a shape the provider's format accepts.
void CheckAddress(std::span<const uint8_t> address, const fi_info& info);

// The address as the provider identifies a peer, for comparing and keying: two spellings that
// reach the same endpoint give the same bytes. shm (libfabric 1.17 to 2.6, smr_no_prefix and
// smr_name_compare) names a peer by the text after the first "://", up to its NUL and 256
// characters; a socket address by family, port and host (sin_zero and flowinfo ignored); efa
// (efa_is_same_addr) by GID, QPN and QKEY. Other formats: the bytes as given.
std::vector<uint8_t> CanonicalAddress(std::span<const uint8_t> address, uint32_t addr_format);

// The file of /dev/shm in which an shm endpoint named `address` keeps its queues (shm's
// "fi_shm://1234:0:1": /dev/shm/1234:0:1), created when the endpoint is enabled; "" for an
// address that is not such a name.
std::string ShmFileOf(std::span<const uint8_t> address, const fi_info& info);

// Prints "addr: <hex>"; writes the hex (and a newline) to --address-file when given, and gives
// it on --oob-port when given (common/oob.hpp).
void PublishAddress(std::span<const uint8_t> address, const Options& options);

// Several addresses (a client's lanes) as one line of comma-separated hex, and back.
void WriteAddressList(const std::vector<std::vector<uint8_t>>& addresses, const std::string& path);
std::vector<std::vector<uint8_t>> ReadAddressList(const std::string& path);

}  // namespace common
