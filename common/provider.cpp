#include "provider.hpp"
#include "provider_watch.hpp"
#include "report.hpp"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include "address.hpp"
#include "error.hpp"

#include <dlfcn.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

namespace common {

static const char* const kDefaultProviders[] = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm"};

uint32_t ApiVersion() {
  return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

std::string VersionText(uint32_t version) {
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

std::string LibraryProblem(uint32_t library, uint32_t wanted) {
  if (FI_VERSION_GE(library, wanted)) return "";
  return "this program was built with libfabric " + VersionText(wanted) +
         " headers but the loader found libfabric " + VersionText(library) +
         " (LD_LIBRARY_PATH, or rebuild against it)";
}

std::string CanonicalProvider(const std::string& name) {
  if (name == "tcp") return "tcp;ofi_rxm";
  if (name == "verbs") return "verbs;ofi_rxm";
  return name;
}

static std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string CudaRuntimeProblem(const char* runtime_name) {
  // Only a libfabric that loads it asks: its file names "libcudart.so" (one built without
  // CUDA, Debian's, does not, and its reason is another).
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&fi_getinfo), &self) == 0 || self.dli_fname == nullptr)
    return "";
  std::ifstream library(self.dli_fname, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(library)), {});
  if (bytes.find(std::string("libcudart.so") + '\0') == std::string::npos) return "";
  void* runtime = dlopen(runtime_name, RTLD_NOW | RTLD_LOCAL);
  if (runtime != nullptr) {
    dlclose(runtime);
    return "";
  }
  const char* error = dlerror();
  return std::string("libfabric cannot load ") + runtime_name + " (" +
         (error ? error : "not found") +
         "): add the CUDA toolkit's lib64 to LD_LIBRARY_PATH (/usr/local/cuda/lib64)";
}

std::vector<std::string> AvailableProviders() {
  fi_info* list = nullptr;
  std::vector<std::string> names;
  if (fi_getinfo(ApiVersion(), nullptr, nullptr, 0, nullptr, &list) != 0) return names;
  FiInfoPtr owner(list);
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    std::string name = i->fabric_attr->prov_name;
    bool seen = false;
    for (const auto& n : names) seen = seen || n == name;
    if (!seen) names.push_back(name);
  }
  return names;
}

std::vector<const fi_info*> EntriesOfFabric(const fi_info* list, const std::string& fabric) {
  std::vector<const fi_info*> kept;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    const std::string provider = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
    const std::string name = i->fabric_attr->name ? i->fabric_attr->name : "";
    const std::string want = !fabric.empty() ? fabric : provider == "efa" ? "efa" : "";
    if (want.empty() || name == want) kept.push_back(i);
  }
  return kept;
}

std::string ImmediateDataProblem(const fi_info& entry) {
  if (entry.domain_attr->cq_data_size >= 4) return "";
  return std::string("provider ") + entry.fabric_attr->prov_name + " carries " +
         std::to_string(entry.domain_attr->cq_data_size) +
         " bytes of immediate data (cq_data_size), but each WRITE names its request in 4";
}

// All entries of one provider that match the hints; empty when there are none.
static FiInfoPtr GetInfo(const fi_info& hints, const std::string& provider) {
  FiInfoPtr h(fi_dupinfo(&hints));
  if (!h) throw Error("fi_dupinfo: out of memory");
  free(h->fabric_attr->prov_name);
  h->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* list = nullptr;
  int rc = fi_getinfo(ApiVersion(), nullptr, nullptr, 0, h.get(), &list);
  if (rc == -FI_ENODATA) return nullptr;
  FI_CHECK(rc);
  return FiInfoPtr(list);
}

std::vector<std::filesystem::path> ShmRegionsOf(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  std::vector<std::filesystem::path> regions;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) regions.push_back(entry.path());
  return regions;
}
void RemoveShmRegionsOf(pid_t pid) {
  std::error_code ec;
  for (const auto& region : ShmRegionsOf(pid)) std::filesystem::remove(region, ec);
}

// Regions named with our own id can only have been left by a dead process: remove them,
// once, before our first shm endpoint.
static void RemoveStaleShmRegions() {
  static bool done = false;
  if (!done) RemoveShmRegionsOf(getpid());
  done = true;
}

// shm keeps each endpoint's queues in a file of /dev/shm and declines to start (its log says
// "Not enough available space") when that file system is missing or nearly full.
static std::string ShmProblem() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0)
    return "/dev/shm is not there (" + std::string(std::strerror(errno)) + ")";
  const double free_mib = static_cast<double>(fs.f_bavail) * fs.f_frsize / (1 << 20);
  if (free_mib < 64)
    return "/dev/shm has " + std::to_string(static_cast<long>(free_mib)) +
           " MiB free, and shm needs about 16 MiB per endpoint";
  if (access("/dev/shm", W_OK) != 0) return "/dev/shm is not writable";
  return "";
}

// The provider's entries, or a UsageError that names what is wrong and what there is.
static FiInfoPtr ProviderEntries(const fi_info& hints, const std::string& asked,
                                 const std::string& chosen) {
  FiInfoPtr list = GetInfo(hints, chosen);
  if (list) return list;
  auto all = AvailableProviders();
  bool known = false;
  for (const auto& n : all) known = known || n == chosen;
  if (!known && chosen == "shm") {
    const std::string why = ShmProblem();
    if (!why.empty()) throw UsageError("provider shm cannot start here: " + why);
  }
  // A provider of a NIC this host lacks (efa on a host without EFA) is absent hardware, not a
  // typing error: exit 77, as for a GPU that is not there.
  static const char* const kNicProviders[] = {"efa", "verbs", "psm2",  "psm3",
                                              "cxi", "opx",   "usnic", "ucx"};
  const std::string core = chosen.substr(0, chosen.find(';'));  // "verbs" of "verbs;ofi_rxm"
  for (const char* nic : kNicProviders)
    if (!known && core == nic)
      throw HardwareAbsent("provider '" + asked +
                           "' is not on this machine (no such NIC, or its "
                           "driver is not loaded); this machine has: " +
                           Join(all));
  if (!known)
    throw UsageError("unknown provider '" + asked + "' (this machine has: " + Join(all) + ")");
  throw UsageError("provider '" + chosen +
                   "' offers no reliable datagram endpoint with what this program needs here");
}

std::vector<FiInfoPtr> SelectDomains(const fi_info& hints, const Options& options,
                                     std::span<const uint8_t> peer, std::string* no_hmem) {
  if (auto why = LibraryProblem(fi_version(), ApiVersion()); !why.empty()) throw Error(why);
  FiInfoPtr list;
  std::string chosen = CanonicalProvider(options.provider);
  if (chosen.empty()) {
    for (const char* candidate : kDefaultProviders) {
      if ((list = GetInfo(hints, candidate))) {
        chosen = candidate;
        break;
      }
    }
    if (!list && (hints.caps & FI_HMEM) && no_hmem != nullptr) {
      FiInfoPtr plain(fi_dupinfo(&hints));
      plain->caps &= ~FI_HMEM;
      auto domains = SelectDomains(*plain, options, peer);
      *no_hmem = std::string("none of efa, verbs;ofi_rxm, tcp;ofi_rxm offers FI_HMEM here");
      if (const std::string cudart = CudaRuntimeProblem(); !cudart.empty())
        *no_hmem += ": " + cudart;
      return domains;
    }
    if (!list)
      throw Error(
          "none of efa, verbs;ofi_rxm, tcp;ofi_rxm is usable here; name one with -p "
          "(this machine has: " +
          Join(AvailableProviders()) + ")");
  } else {
    if ((hints.caps & FI_HMEM) && no_hmem != nullptr && !(list = GetInfo(hints, chosen))) {
      FiInfoPtr plain(fi_dupinfo(&hints));
      plain->caps &= ~FI_HMEM;
      auto domains = SelectDomains(*plain, options, peer);
      *no_hmem = "provider " + chosen + " offers no FI_HMEM (GPU memory) here";
      return domains;
    }
    if (!list) list = ProviderEntries(hints, options.provider, chosen);
  }

  std::vector<const fi_info*> entries = EntriesOfFabric(list.get(), options.fabric);
  if (entries.empty()) {
    std::vector<std::string> fabrics;
    for (const fi_info* i = list.get(); i != nullptr; i = i->next)
      if (!std::set<std::string>(fabrics.begin(), fabrics.end()).count(i->fabric_attr->name))
        fabrics.push_back(i->fabric_attr->name);
    throw UsageError("provider " + chosen + " has no fabric '" + options.fabric +
                     "' (fabrics: " + Join(fabrics) + ")");
  }
  if (hints.caps & FI_RMA) {
    const std::string problem = ImmediateDataProblem(*entries.front());
    if (!problem.empty()) throw UsageError(problem);
  }

  std::vector<FiInfoPtr> domains;
  std::vector<std::string> names;
  bool wrong_address = false;
  for (const fi_info* i : entries) {
    const std::string name = i->domain_attr->name ? i->domain_attr->name : "";
    if (!std::set<std::string>(names.begin(), names.end()).count(name)) names.push_back(name);
    if (!options.domain.empty() && name != options.domain) continue;
    if (!peer.empty()) {
      auto len = AddressLength(i->addr_format);
      if (len ? *len != peer.size() : i->addr_format != FI_ADDR_STR) {
        wrong_address = true;
        continue;
      }
    }
    bool have = false;
    for (const auto& d : domains) have = have || name == d->domain_attr->name;
    if (have) continue;
    domains.emplace_back(fi_dupinfo(i));
    domains.back()->next = nullptr;
  }
  if (domains.empty() && !options.domain.empty() && !wrong_address)
    throw UsageError("provider " + chosen + " has no domain '" + options.domain +
                     "' (domains: " + Join(names) + ")");
  if (domains.empty()) {
    CheckAddress(peer, *entries.front());  // throws the one-line reason
    throw UsageError("address does not fit provider " + chosen);
  }
  if (!peer.empty()) CheckAddress(peer, *domains.front());
  if (chosen == "shm") RemoveStaleShmRegions();
  NoteProvider(
      domains.front()->fabric_attr->prov_name ? domains.front()->fabric_attr->prov_name : "",
      domains.front()->fabric_attr->name ? domains.front()->fabric_attr->name : "");
  SetWatchedProvider(domains.front()->fabric_attr->prov_name);  // for a stated exit's line
  return domains;
}

FiInfoPtr SelectProvider(const fi_info& hints, const Options& options,
                         std::span<const uint8_t> peer, std::string* no_hmem) {
  auto domains = SelectDomains(hints, options, peer, no_hmem);
  return std::move(domains.front());
}

// FI_OPT_MAX_MSG_SIZE is in the headers from API 1.22 (an enum: their version says so); an
// older libfabric at run time answers -FI_ENOPROTOOPT.
#define HAVE_MAX_MSG_SIZE_OPTION \
  FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 22))
size_t MessageLimitFrom(int getopt_rc, size_t option, size_t attribute) {
  return getopt_rc == 0 && option > 0 ? option : attribute;
}
size_t MessageLimit([[maybe_unused]] fid_ep* ep, const fi_info& info) {
  int rc = -FI_ENOPROTOOPT;
  size_t option = 0;
#if HAVE_MAX_MSG_SIZE_OPTION
  size_t length = sizeof option;
  rc = fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MAX_MSG_SIZE, &option, &length);
#endif
  return MessageLimitFrom(rc, option, info.ep_attr->max_msg_size);
}

double LinkGbps(const fi_info& info) {
  if (info.nic == nullptr || info.nic->link_attr == nullptr) return 0;
  return static_cast<double>(info.nic->link_attr->speed) / 1e9;
}

}  // namespace common
