#include "provider.hpp"

#include "address.hpp"
#include "error.hpp"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

namespace common {

static constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
static const char* const kDefaultProviders[] = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm"};

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

std::vector<std::string> AvailableProviders() {
  fi_info* list = nullptr;
  std::vector<std::string> names;
  if (fi_getinfo(kApiVersion, nullptr, nullptr, 0, nullptr, &list) != 0) return names;
  FiInfoPtr owner(list);
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    std::string name = i->fabric_attr->prov_name;
    bool seen = false;
    for (const auto& n : names) seen = seen || n == name;
    if (!seen) names.push_back(name);
  }
  return names;
}

// All entries of one provider that match the hints; empty when there are none.
static FiInfoPtr GetInfo(const fi_info& hints, const std::string& provider) {
  FiInfoPtr h(fi_dupinfo(&hints));
  if (!h) throw Error("fi_dupinfo: out of memory");
  free(h->fabric_attr->prov_name);
  h->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* list = nullptr;
  int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, h.get(), &list);
  if (rc == -FI_ENODATA) return nullptr;
  FI_CHECK(rc);
  return FiInfoPtr(list);
}

void RemoveShmRegionsOf(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0)
      std::filesystem::remove(entry.path(), ec);
}

// Regions named with our own id can only have been left by a dead process: remove them,
// once, before our first shm endpoint.
static void RemoveStaleShmRegions() {
  static bool done = false;
  if (!done) RemoveShmRegionsOf(getpid());
  done = true;
}

std::vector<FiInfoPtr> SelectDomains(const fi_info& hints, const std::string& provider,
                                     const std::string& domain, std::span<const uint8_t> peer) {
  FiInfoPtr list;
  std::string chosen = CanonicalProvider(provider);
  if (chosen.empty()) {
    for (const char* candidate : kDefaultProviders) {
      if ((list = GetInfo(hints, candidate))) {
        chosen = candidate;
        break;
      }
    }
    if (!list)
      throw Error(
          "none of efa, verbs;ofi_rxm, tcp;ofi_rxm is usable here; name one with -p "
          "(this machine has: " +
          Join(AvailableProviders()) + ")");
  } else {
    list = GetInfo(hints, chosen);
    if (!list) {
      auto all = AvailableProviders();
      bool known = false;
      for (const auto& n : all) known = known || n == chosen;
      if (!known)
        throw UsageError("unknown provider '" + provider + "' (this machine has: " + Join(all) +
                         ")");
      throw UsageError("provider '" + chosen +
                       "' offers no reliable datagram endpoint with messages and RMA here");
    }
  }

  std::vector<FiInfoPtr> domains;
  std::vector<std::string> names;
  bool wrong_address = false;
  for (const fi_info* i = list.get(); i != nullptr; i = i->next) {
    const std::string name = i->domain_attr->name ? i->domain_attr->name : "";
    if (!std::set<std::string>(names.begin(), names.end()).count(name)) names.push_back(name);
    if (!domain.empty() && name != domain) continue;
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
  if (domains.empty() && !domain.empty() && !wrong_address)
    throw UsageError("provider " + chosen + " has no domain '" + domain +
                     "' (domains: " + Join(names) + ")");
  if (domains.empty()) {
    CheckAddress(peer, *list);  // throws the one-line reason
    throw UsageError("address does not fit provider " + chosen);
  }
  if (!peer.empty()) CheckAddress(peer, *domains.front());
  if (chosen == "shm") RemoveStaleShmRegions();
  return domains;
}

FiInfoPtr SelectProvider(const fi_info& hints, const std::string& provider,
                         const std::string& domain, std::span<const uint8_t> peer) {
  auto domains = SelectDomains(hints, provider, domain, peer);
  return std::move(domains.front());
}

double LinkGbps(const fi_info& info) {
  if (info.nic == nullptr || info.nic->link_attr == nullptr) return 0;
  return static_cast<double>(info.nic->link_attr->speed) / 1e9;
}

}  // namespace common
