// RAII lifetimes: a full shm endpoint stack opened and closed many times leaks nothing.
#include <gtest/gtest.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <filesystem>

#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "provider.hpp"

using namespace common;

static size_t OpenFileDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// The handles of one endpoint stack, declared in creation order.
struct Stack {
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  MrPtr mr;
};

static void OpenStack(Stack& s, HostBuffer& buffer) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  s.info = SelectProvider(*hints, "shm", "");
  fid_fabric* fabric;
  FI_CHECK(fi_fabric(s.info->fabric_attr, &fabric, nullptr));
  s.fabric.reset(fabric);
  fid_domain* domain;
  FI_CHECK(fi_domain(s.fabric.get(), s.info.get(), &domain, nullptr));
  s.domain.reset(domain);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  fid_cq* cq;
  FI_CHECK(fi_cq_open(s.domain.get(), &cq_attr, &cq, nullptr));
  s.cq.reset(cq);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av;
  FI_CHECK(fi_av_open(s.domain.get(), &av_attr, &av, nullptr));
  s.av.reset(av);
  fid_ep* ep;
  FI_CHECK(fi_endpoint(s.domain.get(), s.info.get(), &ep, nullptr));
  s.ep.reset(ep);
  FI_CHECK(fi_ep_bind(s.ep.get(), &s.cq->fid, FI_TRANSMIT | FI_RECV));
  FI_CHECK(fi_ep_bind(s.ep.get(), &s.av->fid, 0));
  FI_CHECK(fi_enable(s.ep.get()));
  fid_mr* mr;
  FI_CHECK(fi_mr_reg(s.domain.get(), buffer.data(), buffer.size(),
                     FI_SEND | FI_RECV | FI_REMOTE_WRITE, 0, 0, 0, &mr, nullptr));
  s.mr.reset(mr);
}

TEST(Handles, HundredShmStacksLeaveNoFileDescriptorBehind) {
  HostBuffer buffer(1 << 20);
  {
    Stack warm;  // the first open loads the provider; measure after that
    OpenStack(warm, buffer);
  }
  const size_t before = OpenFileDescriptors();
  for (int i = 0; i < 100; ++i) {
    Stack s;
    OpenStack(s, buffer);
    ASSERT_GT(OpenFileDescriptors(), 0u);
  }
  EXPECT_EQ(OpenFileDescriptors(), before);
}

TEST(Handles, MovedHandleIsClosedOnce) {
  HostBuffer buffer(4096);
  Stack s;
  OpenStack(s, buffer);
  EpPtr moved = std::move(s.ep);
  EXPECT_EQ(s.ep, nullptr);
  moved.reset();  // closes here; s's destructor must not close it again
  SUCCEED();
}

TEST(HostBuffer, AlignedAndZeroed) {
  HostBuffer b(10000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kBufferAlignment, 0u);
  EXPECT_EQ(b.size(), 10000u);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], 0);
}

TEST(Provider, NamesAndSelection) {
  EXPECT_EQ(CanonicalProvider("tcp"), "tcp;ofi_rxm");
  EXPECT_EQ(CanonicalProvider("verbs"), "verbs;ofi_rxm");
  EXPECT_EQ(CanonicalProvider("shm"), "shm");
  auto all = AvailableProviders();
  EXPECT_NE(std::find(all.begin(), all.end(), "shm"), all.end());
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  auto lo = SelectDomains(*hints, "tcp", "lo");
  ASSERT_EQ(lo.size(), 1u);
  EXPECT_STREQ(lo[0]->domain_attr->name, "lo");
  EXPECT_THROW(SelectDomains(*hints, "tcp", "no-such-nic"), UsageError);
  EXPECT_THROW(SelectDomains(*hints, "no-such-provider", ""), UsageError);
  // The default order never picks shm: it reaches only this host.
  auto chosen = SelectProvider(*hints, "", "");
  EXPECT_STRNE(chosen->fabric_attr->prov_name, "shm");
}
