// RAII owners for libfabric handles: each is a std::unique_ptr whose deleter calls
// fi_close (or fi_freeinfo) and logs a failure instead of throwing.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdio>
#include <memory>

namespace common {

struct FiInfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};

template <typename Fid>
struct FidCloser {
  void operator()(Fid* handle) const noexcept {
    if (handle == nullptr) return;
    int rc = fi_close(&handle->fid);
    if (rc != 0) std::fprintf(stderr, "warning: fi_close: %s\n", fi_strerror(-rc));
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
