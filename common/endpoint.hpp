// An endpoint and the objects behind it (fabric, domain, CQ, AV), opened in one call, once the
// lesson of opening them is behind: 07 (its lanes' Network and its service's control
// endpoint), the hostile-peer test program and the unit tests. Stages 01-06 open their own
// (Network::Open): that is what they teach.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <span>
#include <vector>

#include "fabric_handles.hpp"
#include "page_buffer.hpp"

namespace common {

// A SEND or a RECV of control messages (common/mailbox.hpp).
struct ControlOp {
  fi_context2 context{};
  bool receive = false;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;  // where a SEND goes
};

struct Endpoint {
  // Opens fabric, domain, CQ (FI_CQ_FORMAT_DATA; with a wait fd when `wait_fd`), AV (table)
  // and an enabled endpoint for `info`; an endpoint that moves pages by GPUDirect RDMA
  // (`pages->nic_only`) refuses the CUDA API first (RefuseCudaApi). Throws Error (UsageError
  // when the provider has no wait fd: the user asked for --wait block). `cq_entries` sizes the
  // CQ (0: the provider's default). `selective`: the CQ is bound with FI_SELECTIVE_COMPLETION,
  // so that only operations posted with FI_COMPLETION (through the *msg calls) report one.
  static Endpoint Open(const fi_info& info, bool wait_fd = false, const MemoryPath* pages = nullptr,
                       size_t cq_entries = 0, bool selective = false);
  std::vector<uint8_t> Address() const;
  // Inserts a peer's address; throws Error when the provider does not accept it.
  fi_addr_t AddPeerAddress(std::span<const uint8_t> address);
  void PostRecv(ControlOp& op);
  bool PostSend(ControlOp& op, fi_addr_t dest);  // false: -FI_EAGAIN
  // Sleeps in the CQ's wait fd until it has something, or `timeout_ms` passes.
  void Wait(int timeout_ms);

  // Declared in creation order, so they are closed in reverse.
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  int wait_fd = -1;
};

}  // namespace common
