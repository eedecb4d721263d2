#include "endpoint.hpp"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "address.hpp"
#include "error.hpp"
#include "protocol.hpp"
#include "provider_watch.hpp"
#include "registration.hpp"

namespace common {

Endpoint Endpoint::Open(const fi_info& info, bool wait_fd, const MemoryPath* pages,
                        size_t cq_entries, bool selective) {
  Endpoint e;
  e.info.reset(fi_dupinfo(&info));
  SetWatchedProvider(info.fabric_attr->prov_name);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(e.info->fabric_attr, &fabric, nullptr));
  e.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(e.fabric.get(), e.info.get(), &domain, nullptr));
  e.domain.reset(domain);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = cq_entries;
  cq_attr.wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
  fid_cq* cq = nullptr;
  const int rc = fi_cq_open(e.domain.get(), &cq_attr, &cq, nullptr);
  if (rc != 0 && wait_fd)
    throw UsageError(std::string("--wait block: provider ") + e.info->fabric_attr->prov_name +
                     " has no file-descriptor wait object (" + fi_strerror(-rc) +
                     "); use --wait spin");
  if (rc != 0 && cq_entries != 0)
    throw Error(std::string("fi_cq_open: provider ") + e.info->fabric_attr->prov_name +
                " refused a CQ of " + std::to_string(cq_entries) + " entries (" + fi_strerror(-rc) +
                ")");
  FI_CHECK(rc);
  e.cq.reset(cq);
  if (wait_fd) FI_CHECK(fi_control(&e.cq->fid, FI_GETWAIT, &e.wait_fd));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  FI_CHECK(fi_av_open(e.domain.get(), &av_attr, &av, nullptr));
  e.av.reset(av);
  fid_ep* ep = nullptr;
  FI_CHECK(fi_endpoint(e.domain.get(), e.info.get(), &ep, nullptr));
  e.ep.reset(ep);
  FI_CHECK(fi_ep_bind(e.ep.get(), &e.cq->fid,
                      FI_TRANSMIT | FI_RECV | (selective ? FI_SELECTIVE_COMPLETION : 0)));
  FI_CHECK(fi_ep_bind(e.ep.get(), &e.av->fid, 0));
  if (pages != nullptr) RefuseCudaApi(e.ep.get(), *pages);
  FI_CHECK(fi_enable(e.ep.get()));
  return e;
}

std::vector<uint8_t> Endpoint::Address() const {
  size_t length = 0;
  fi_getname(&ep->fid, nullptr, &length);
  std::vector<uint8_t> address(length);
  FI_CHECK(fi_getname(&ep->fid, address.data(), &length));
  address.resize(length);
  return address;
}

fi_addr_t Endpoint::AddPeerAddress(std::span<const uint8_t> address) {
  CheckAddress(address, *info);  // a peer's address has this provider's shape, or is refused
  fi_addr_t addr = FI_ADDR_UNSPEC;
  if (fi_av_insert(av.get(), address.data(), 1, &addr, 0, nullptr) != 1)
    throw Error("fi_av_insert: the peer address was not accepted");
  return addr;
}

void Endpoint::PostRecv(ControlOp& op) {
  op.receive = true;
  FI_CHECK(
      fi_recv(ep.get(), op.buffer, wire::kMaxMessageBytes, op.desc, FI_ADDR_UNSPEC, &op.context));
}

bool Endpoint::PostSend(ControlOp& op, fi_addr_t dest) {
  op.receive = false;
  op.peer = dest;
  const InProvider inside("fi_send");  // spins for good on a dead shm peer's lock
  const ssize_t rc = fi_send(ep.get(), op.buffer, op.length, op.desc, dest, &op.context);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}

void Endpoint::Wait(int timeout_ms) {
  if (wait_fd < 0) return;
  fid* f = &cq->fid;
  if (fi_trywait(fabric.get(), &f, 1) != FI_SUCCESS) return;
  pollfd fd{wait_fd, POLLIN, 0};
  poll(&fd, 1, timeout_ms);
}

}  // namespace common
