// The server's address, out of band, as fabtests' -E/oob_sock does: a server with
// --oob-port PORT hands its address (hex, one line) to whoever connects to that TCP port; a
// client with --oob-port PORT HOST takes it from there, waiting for the server to come up.
// Hosts then need no shared file system, no sleep and no stale file (docs/p5.md: ssh, Slurm,
// Kubernetes). The listener faces the network: it writes one short line, without waiting, to
// whoever connects, and closes; it keeps no state for anyone.
#pragma once

#include <cstdint>
#include <string>

namespace common {

// Listens on TCP `port` of every interface and answers each connection with `hex` and a
// newline, from a thread of its own, until the process ends. Throws UsageError (exit 2) when
// the port cannot be had.
void ServeAddressOnPort(const std::string& hex, uint16_t port);

// The address a server with --oob-port gives on `host`:`port`: connects again until one answers
// (the server may still be opening its NICs) or `seconds` pass; throws Error (exit 1) naming
// what went wrong last.
std::string FetchAddressFrom(const std::string& host, uint16_t port, double seconds);

}  // namespace common
