// Provider choice as pure functions over fi_info lists built by hand: the API version, the
// fabric of efa (efa, not the efa-direct it lists first), the immediate data a provider
// carries. No provider is loaded here; the lists say what a p5's libfabric 2.x answers.
#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstring>

#include "fabric_handles.hpp"
#include "provider.hpp"

using namespace common;

namespace {

// An entry as fi_getinfo returns it, with what selection reads.
fi_info* Entry(const char* provider, const char* fabric, const char* domain, size_t cq_data) {
  fi_info* i = fi_allocinfo();
  i->fabric_attr->prov_name = strdup(provider);
  i->fabric_attr->name = strdup(fabric);
  i->domain_attr->name = strdup(domain);
  i->domain_attr->cq_data_size = cq_data;
  return i;
}

// A list in libfabric's order; freed with its head.
FiInfoPtr List(std::initializer_list<fi_info*> entries) {
  fi_info* head = nullptr;
  fi_info** tail = &head;
  for (fi_info* e : entries) {
    *tail = e;
    tail = &e->next;
  }
  return FiInfoPtr(head);
}

std::vector<std::string> Fabrics(const std::vector<const fi_info*>& entries) {
  std::vector<std::string> names;
  for (const fi_info* e : entries)
    names.push_back(std::string(e->fabric_attr->name) + "/" + e->domain_attr->name);
  return names;
}

}  // namespace

TEST(Provider, ApiVersionIsTheHeaders) {
  EXPECT_EQ(ApiVersion(), FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION));
  EXPECT_GE(ApiVersion(), FI_VERSION(1, 17));
  EXPECT_EQ(VersionText(FI_VERSION(2, 6)), "2.6");
  EXPECT_EQ(VersionText(FI_VERSION(1, 17)), "1.17");
  // A library older than the headers cannot serve the program; newer or equal can.
  EXPECT_EQ(LibraryProblem(FI_VERSION(2, 6), FI_VERSION(1, 17)), "");
  EXPECT_EQ(LibraryProblem(FI_VERSION(1, 17), FI_VERSION(1, 17)), "");
  EXPECT_EQ(LibraryProblem(FI_VERSION(1, 17), FI_VERSION(2, 6)),
            "this program was built with libfabric 2.6 headers but the loader found libfabric "
            "1.17 (LD_LIBRARY_PATH, or rebuild against it)");
}

// libfabric 2.x lists efa-direct before efa for each NIC (prov/efa/src/efa_prov.c): taking
// the first entry would pick efa-direct by accident.
// libfabric's own dlopen of the CUDA runtime, tried as it tries it: here the runtime loads; a
// name that is nowhere is named with the fix by a libfabric that loads CUDA (2.x built with
// it), and is no concern of one built without (Debian's 1.17 names no libcudart.so).
TEST(Provider, CudaRuntimeAsLibfabricLoadsIt) {
  EXPECT_EQ(CudaRuntimeProblem(), "");
  const std::string absent = CudaRuntimeProblem("libno-such-cudart.so");
  if (FI_MAJOR(fi_version()) >= 2) {
    EXPECT_EQ(absent.rfind("libfabric cannot load libno-such-cudart.so (", 0), 0u) << absent;
    EXPECT_NE(absent.find("LD_LIBRARY_PATH (/usr/local/cuda/lib64)"), std::string::npos);
  } else {
    EXPECT_EQ(absent, "");
  }
}

TEST(Provider, EfaMeansTheEfaFabricUnlessAskedOtherwise) {
  FiInfoPtr list = List(
      {Entry("efa", "efa-direct", "rdmap79s0-rdm", 4), Entry("efa", "efa", "rdmap79s0-rdm", 4),
       Entry("efa", "efa-direct", "rdmap80s0-rdm", 4), Entry("efa", "efa", "rdmap80s0-rdm", 4)});
  EXPECT_EQ(Fabrics(EntriesOfFabric(list.get(), "")),
            (std::vector<std::string>{"efa/rdmap79s0-rdm", "efa/rdmap80s0-rdm"}));
  EXPECT_EQ(Fabrics(EntriesOfFabric(list.get(), "efa-direct")),
            (std::vector<std::string>{"efa-direct/rdmap79s0-rdm", "efa-direct/rdmap80s0-rdm"}));
  EXPECT_TRUE(EntriesOfFabric(list.get(), "efa-dirct").empty());
}

TEST(Provider, OtherProvidersKeepEveryFabric) {
  FiInfoPtr tcp = List({Entry("tcp;ofi_rxm", "127.0.0.1/32", "lo", 8),
                        Entry("tcp;ofi_rxm", "198.18.0.0/24", "mca0", 8)});
  EXPECT_EQ(EntriesOfFabric(tcp.get(), "").size(), 2u);
  EXPECT_EQ(Fabrics(EntriesOfFabric(tcp.get(), "198.18.0.0/24")),
            (std::vector<std::string>{"198.18.0.0/24/mca0"}));
  FiInfoPtr shm = List({Entry("shm", "shm", "shm", 8)});
  EXPECT_EQ(EntriesOfFabric(shm.get(), "").size(), 1u);
}

// Each WRITE names its request in 4 bytes of immediate data: efa has exactly 4, tcp and shm 8.
TEST(Provider, ImmediateDataMustHoldARequestId) {
  FiInfoPtr efa = List({Entry("efa", "efa", "rdmap79s0-rdm", 4)});
  FiInfoPtr shm = List({Entry("shm", "shm", "shm", 8)});
  FiInfoPtr small = List({Entry("someprov", "f", "d", 2)});
  EXPECT_EQ(ImmediateDataProblem(*efa), "");
  EXPECT_EQ(ImmediateDataProblem(*shm), "");
  EXPECT_EQ(ImmediateDataProblem(*small),
            "provider someprov carries 2 bytes of immediate data (cq_data_size), but each WRITE "
            "names its request in 4");
}

// The longest control message: what FI_OPT_MAX_MSG_SIZE says where the provider answers it.
// efa-direct with FI_RMA reports the RDMA maximum in max_msg_size (1 GiB here) and its MTU
// (8 KiB; fi_efa(7)) through the option; a libfabric before 1.22, or a provider without the
// option, answers -FI_ENOPROTOOPT and the attribute stands.
TEST(MessageLimit, TheOptionBeforeTheAttribute) {
  constexpr size_t kRdmaMax = 1ull << 30;
  EXPECT_EQ(MessageLimitFrom(0, 8192, kRdmaMax), 8192u);               // efa-direct
  EXPECT_EQ(MessageLimitFrom(0, UINT64_MAX, UINT64_MAX), UINT64_MAX);  // efa: no limit
  EXPECT_EQ(MessageLimitFrom(-FI_ENOPROTOOPT, 0, 65536), 65536u);      // 1.17, shm
  EXPECT_EQ(MessageLimitFrom(0, 0, 65536), 65536u);  // an option of 0 says nothing
}
