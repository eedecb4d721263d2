// RAII owners for libfabric handles: each is a std::unique_ptr whose deleter calls
// fi_close (or fi_freeinfo) and logs a failure instead of throwing.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdio>
#include <memory>

#include "program.hpp"

namespace common {

struct FiInfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};

// The object a close failed on, named.
inline const char* FidClassName(size_t fclass) {
  switch (fclass) {
    case FI_CLASS_FABRIC:
      return "fabric";
    case FI_CLASS_DOMAIN:
      return "domain";
    case FI_CLASS_EP:
      return "endpoint";
    case FI_CLASS_AV:
      return "AV";
    case FI_CLASS_MR:
      return "MR";
    case FI_CLASS_CQ:
      return "CQ";
    default:
      return "object";
  }
}
template <typename Fid>
struct FidCloser {
  void operator()(Fid* handle) const noexcept {
    if (handle == nullptr) return;
    const size_t fclass = handle->fid.fclass;  // before the close frees it
    int rc = fi_close(&handle->fid);
    if (rc == 0) return;
    // Ours close first (the owners declare them in creation order): a domain or fabric still
    // busy after them holds something of the provider's own, such as a connection a stray
    // peer opened; the process's exit frees it, and -v says so.
    if (rc == -FI_EBUSY && (fclass == FI_CLASS_DOMAIN || fclass == FI_CLASS_FABRIC))
      Diagnostic("the provider kept an object of its own in a %s it could not close (%s)\n",
                 FidClassName(fclass), fi_strerror(-rc));
    else
      std::fprintf(stderr, "warning: fi_close of a %s: %s\n", FidClassName(fclass),
                   fi_strerror(-rc));
  }
};

using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;
using FabricPtr = std::unique_ptr<fid_fabric, FidCloser<fid_fabric>>;
using DomainPtr = std::unique_ptr<fid_domain, FidCloser<fid_domain>>;
using CqPtr = std::unique_ptr<fid_cq, FidCloser<fid_cq>>;
using AvPtr = std::unique_ptr<fid_av, FidCloser<fid_av>>;
using EpPtr = std::unique_ptr<fid_ep, FidCloser<fid_ep>>;
using MrPtr = std::unique_ptr<fid_mr, FidCloser<fid_mr>>;

}  // namespace common
