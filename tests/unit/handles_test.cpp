// RAII lifetimes: a full shm endpoint stack opened and closed many times leaks nothing.
#include <gtest/gtest.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <filesystem>

#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "program.hpp"
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
  Options options;
  options.provider = "shm";
  s.info = SelectProvider(*hints, options);
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
    {
      Stack s;
      OpenStack(s, buffer);
    }
    ASSERT_EQ(OpenFileDescriptors(), before) << "after stack " << i;
  }
}

// A handle whose close only counts: the deleter must close a moved handle exactly once.
static int closes = 0;
static int CountClose(fid*) {
  ++closes;
  return 0;
}
// A handle of class `fclass` whose close is `ops`' (which must outlive it).
template <typename Fid>
static Fid HandleOf(size_t fclass, fi_ops& ops, int (*close)(fid*)) {
  ops.size = sizeof(ops);
  ops.close = close;
  Fid handle{};
  handle.fid.fclass = fclass;
  handle.fid.ops = &ops;
  return handle;
}

TEST(Handles, MovedHandleIsClosedOnce) {
  fi_ops ops{};
  fid_ep endpoint = HandleOf<fid_ep>(FI_CLASS_EP, ops, CountClose);
  closes = 0;
  {
    EpPtr first(&endpoint);
    EpPtr moved = std::move(first);
    EXPECT_EQ(first, nullptr);
    EXPECT_EQ(closes, 0);
    moved.reset();  // closes here; first's destructor must not close it again
    EXPECT_EQ(closes, 1);
  }
  EXPECT_EQ(closes, 1);
}

// A close that fails is logged, not thrown: destructors must run to the end.
static int FailClose(fid*) {
  ++closes;
  return -FI_EBUSY;
}

TEST(Handles, FailedCloseIsLoggedNotThrown) {
  fi_ops ops{};
  fid_cq cq = HandleOf<fid_cq>(FI_CLASS_CQ, ops, FailClose);
  closes = 0;
  testing::internal::CaptureStderr();
  { CqPtr owner(&cq); }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(closes, 1);
  EXPECT_EQ(err, "warning: fi_close of a CQ: Device or resource busy\n");
}

// A domain still busy once ours are closed holds the provider's own objects: said with -v
// only, on stdout, as a diagnostic; a normal run's stderr stays empty.
TEST(Handles, BusyDomainIsADiagnostic) {
  fi_ops ops{};
  fid_domain domain = HandleOf<fid_domain>(FI_CLASS_DOMAIN, ops, FailClose);
  for (const bool verbose : {false, true}) {
    SetVerbose(verbose);
    closes = 0;
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    { DomainPtr owner(&domain); }
    const std::string err = testing::internal::GetCapturedStderr();
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(closes, 1);
    EXPECT_EQ(err, "");
    EXPECT_EQ(out, verbose ? "the provider kept an object of its own in a domain it could not "
                             "close (Device or resource busy)\n"
                           : "");
  }
  SetVerbose(false);
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
  Options tcp_lo;
  tcp_lo.provider = "tcp";
  tcp_lo.domain = "lo";
  auto lo = SelectDomains(*hints, tcp_lo);
  ASSERT_EQ(lo.size(), 1u);
  EXPECT_STREQ(lo[0]->domain_attr->name, "lo");
  Options no_nic = tcp_lo;
  no_nic.domain = "no-such-nic";
  EXPECT_THROW(SelectDomains(*hints, no_nic), UsageError);
  Options no_provider;
  no_provider.provider = "no-such-provider";
  EXPECT_THROW(SelectDomains(*hints, no_provider), UsageError);
  // The default order never picks shm: it reaches only this host.
  auto chosen = SelectProvider(*hints, Options{});
  EXPECT_STRNE(chosen->fabric_attr->prov_name, "shm");
}
