// Provider selection (DESIGN.md, "Programs"): the provider named with -p, else the first of
// efa, verbs;ofi_rxm and tcp;ofi_rxm that offers what the hints ask for. shm is never chosen
// unless asked for: it reaches only this host.
#pragma once

#include <sys/types.h>

#include "fabric_handles.hpp"

#include <span>
#include <string>
#include <vector>

namespace common {

// Short names users type: "tcp" means "tcp;ofi_rxm", "verbs" means "verbs;ofi_rxm".
std::string CanonicalProvider(const std::string& name);

// Every provider this machine's libfabric offers, in its own order, without duplicates.
std::vector<std::string> AvailableProviders();

// One fi_info per domain ("NIC") of the chosen provider that matches the hints, in
// libfabric's order. `domain`, when not empty, keeps only that domain; `peer`, when not
// empty, keeps only entries whose address format fits that address (a client's choice).
// Throws UsageError for an unknown provider or domain, naming it and what there is instead.
std::vector<FiInfoPtr> SelectDomains(const fi_info& hints, const std::string& provider,
                                     const std::string& domain, std::span<const uint8_t> peer = {});

// The first of SelectDomains().
FiInfoPtr SelectProvider(const fi_info& hints, const std::string& provider,
                         const std::string& domain, std::span<const uint8_t> peer = {});

// Sum of the link speeds libfabric reports for these domains, in Gbit/s (0 when unknown).
double LinkGbps(const fi_info& info);

// Removes the shared-memory regions shm made for process `pid` (/dev/shm/PID:...). Only for
// a process that is gone: a process killed with SIGKILL leaves them behind, 16 MiB each, and
// shm cannot open an endpoint (EBUSY) for a later process that gets the same id.
void RemoveShmRegionsOf(pid_t pid);

}  // namespace common
