// Provider selection (docs/architecture.md, "Programs"): the provider named with -p, else the
// first of efa, verbs;ofi_rxm and tcp;ofi_rxm that offers what the hints ask for. shm is never
// chosen unless asked for: it reaches only this host. The pure functions below (API version,
// fabric choice, immediate-data check) are unit-tested on fi_info lists built by hand.
#pragma once

#include <sys/types.h>

#include "fabric_handles.hpp"
#include "options.hpp"

#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace common {

// The API version every program asks for: its headers' own (1.17 with Debian's libfabric, 2.x
// with the EFA installer's). What those headers name is then also what providers grant:
// efa refuses FI_MR_DMABUF below 1.20 and stops using the CUDA API below 1.18.
uint32_t ApiVersion();
std::string VersionText(uint32_t version);  // "1.17"
// Why a library of version `library` cannot serve a program that asks for `wanted` ("" if it
// can): built against newer headers than the library the loader found.
std::string LibraryProblem(uint32_t library, uint32_t wanted);

// Short names users type: "tcp" means "tcp;ofi_rxm", "verbs" means "verbs;ofi_rxm".
std::string CanonicalProvider(const std::string& name);

// Every provider this machine's libfabric offers, in its own order, without duplicates.
std::vector<std::string> AvailableProviders();

// Of fi_getinfo's entries, those of one fabric. efa offers two, listed efa-direct first:
// "efa" (the full RDM protocol: any message size, handshakes, no FI_MR_LOCAL) and
// "efa-direct" (the device's own queues: FI_MR_LOCAL, FI_CONTEXT2, messages up to the MTU).
// `fabric` empty: "efa" for provider efa, every fabric for the others.
std::vector<const fi_info*> EntriesOfFabric(const fi_info* list, const std::string& fabric);

// Why an entry cannot carry the transfer stages' WRITEs ("" if it can): each WRITE names its
// request in 4 bytes of immediate data (EFA has exactly 4), so cq_data_size must be >= 4.
std::string ImmediateDataProblem(const fi_info& entry);

// One fi_info per domain ("NIC") of the chosen provider (options.provider, .fabric, .domain)
// that matches the hints, in libfabric's order. `peer`, when not empty, keeps only entries
// whose address format fits that address (a client's choice). Hints with FI_HMEM and a
// `no_hmem` to fill: where no entry offers FI_HMEM, it is left out, and `no_hmem` says so
// (the caller stages GPU memory). Throws UsageError for an unknown provider, fabric or domain,
// naming it and what there is instead.
std::vector<FiInfoPtr> SelectDomains(const fi_info& hints, const Options& options,
                                     std::span<const uint8_t> peer = {},
                                     std::string* no_hmem = nullptr);

// Why libfabric cannot load the CUDA runtime ("" if it can): a libfabric built with CUDA
// loaded at run time (the EFA installer's, --enable-cuda-dlopen) opens "libcudart.so", the
// unversioned name that only the toolkit's development files or its lib64 directory give
// (2.6 src/hmem_cuda.c, cuda_hmem_dl_init); without it no provider offers FI_HMEM, and GPU
// memory has no direct path. Tried here as libfabric tries it (this program sets no run path);
// `runtime` is the name it opens.
std::string CudaRuntimeProblem(const char* runtime = "libcudart.so");

// The first of SelectDomains().
FiInfoPtr SelectProvider(const fi_info& hints, const Options& options,
                         std::span<const uint8_t> peer = {}, std::string* no_hmem = nullptr);

// The longest message `ep` may SEND: FI_OPT_MAX_MSG_SIZE where the provider answers it
// (efa-direct: the device's MTU, about 8 KiB, fi_efa(7)), else `info`'s max_msg_size, which
// with FI_RMA may be the RDMA maximum instead. MessageLimitFrom: the choice, given
// fi_getopt's return code and value (tests feed it what providers report).
size_t MessageLimit(fid_ep* ep, const fi_info& info);
size_t MessageLimitFrom(int getopt_rc, size_t option, size_t attribute);

// Sum of the link speeds libfabric reports for these domains, in Gbit/s (0 when unknown).
double LinkGbps(const fi_info& info);

// The shared-memory regions shm made for process `pid`: /dev/shm/PID:UID:INDEX, a file per
// endpoint.
std::vector<std::filesystem::path> ShmRegionsOf(pid_t pid);
// Removes them. Only for a process that is gone: a process killed with SIGKILL leaves them
// behind, megabytes each (13 MB with libfabric 2.6), and shm cannot open an endpoint (EBUSY) for a
// later process that gets the same id.
void RemoveShmRegionsOf(pid_t pid);

}  // namespace common
