// GPU memory from any thread (the GPU machine; skipped without a GPU or without a libfabric
// that takes GPU memory). A thread starts with no CUDA context: dmabuf export and the
// provider's CUDA calls then fail, or quietly fall back, on a thread that has made no CUDA
// call of its own, such as 07's data threads or a framework's workers.
#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "cuda_memory.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "process.hpp"
#include "provider.hpp"
#include "registration.hpp"

using namespace common;
using namespace std::chrono_literals;

TEST(GpuMemory, RegistersFromANewThread) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_HMEM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  hints->fabric_attr->prov_name = strdup("shm");
  fi_info* found = nullptr;
  if (fi_getinfo(ApiVersion(), nullptr, nullptr, 0, hints.get(), &found) != 0)
    GTEST_SKIP() << "shm offers no FI_HMEM with libfabric " << VersionText(fi_version());
  FiInfoPtr info(found);
  Endpoint e = Endpoint::Open(*info);
  const uint64_t access = FI_REMOTE_WRITE | FI_WRITE;

  // The main thread's registration, for comparison: whether it was a dmabuf.
  CudaBuffer first(2 << 20, 0);
  bool main_dmabuf = false;
  MrPtr main_mr;
  try {
    main_mr = RegisterMemory(e.domain.get(), *info, first.data(), first.size(), access, &first,
                             true, &main_dmabuf);
  } catch (const Error& ex) {  // libfabric 1.17 lists FI_HMEM, but was built without CUDA
    GTEST_SKIP() << "shm does not register GPU memory with libfabric " << VersionText(fi_version())
                 << ": " << ex.what();
  }
  const bool main_export = first.ExportDmabuf(first.data(), first.size()).get() >= 0;

  // A buffer allocated here, exported and registered by a thread that never called CUDA.
  CudaBuffer second(2 << 20, 0);
  std::string failure;
  bool thread_dmabuf = false, thread_export = false;
  std::thread([&] {
    try {
      thread_export = second.ExportDmabuf(second.data(), second.size()).get() >= 0;
      MrPtr mr = RegisterMemory(e.domain.get(), *info, second.data(), second.size(), access,
                                &second, true, &thread_dmabuf);
      std::vector<uint8_t> bytes(4096, 0x5a), back(4096);
      second.CopyFromHost(0, bytes.data(), bytes.size());
      second.CopyToHost(back.data(), 0, back.size());
      if (back != bytes) failure = "the GPU bytes written from the thread did not come back";
    } catch (const std::exception& ex) {
      failure = ex.what();
    }
  }).join();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(thread_export, main_export) << "dmabuf export differs on a new thread";
  EXPECT_EQ(thread_dmabuf, main_dmabuf) << "registration took another path on a new thread";
  std::printf("main thread: dmabuf %s; new thread: dmabuf %s\n", main_dmabuf ? "yes" : "no",
              thread_dmabuf ? "yes" : "no");
}

// A region of 8 GiB in VMM memory (4 requests of 512 pages of 2 MiB, and a region holds twice
// the pages asked for: over 400 chunks of 20 MiB), written over shm from the server's own VMM
// memory and verified; its registration is reported apart, per GiB.
TEST(GpuMemory, LargeVmmRegionIsWrittenAndVerified) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  testing_support::StageServer server(
      "07_full_p5", "shm", 1,
      {"--memory", "cuda-vmm", "--client-memory", "8g", "--server-memory", "8g"});
  ASSERT_FALSE(server.address().empty());
  testing_support::Result r = testing_support::RunClient(
      "07_full_p5", "shm", server.address(),
      {"--memory", "cuda-vmm", "-S", "2m", "--pages", "512", "--requests", "4", "--json"}, 300s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\"memory\":\"cuda-vmm-"), std::string::npos) << r.out;
  EXPECT_EQ(testing_support::NumberAfter(r.out, "\"verified_bytes\":"), 4LL << 30) << r.out;
  EXPECT_EQ(testing_support::NumberAfter(r.out, "\"registered_bytes\":"), 8LL << 30) << r.out;
  EXPECT_GT(testing_support::DecimalAfter(r.out, "\"registration_seconds\":"), 0) << r.out;
  EXPECT_EQ(server.Wait(60s).exit_code, 0);
}

// The same 8 GiB region with the GPU nearly full: this process takes all but what the server
// and the client need (their 12 GiB and room for their CUDA contexts), so that the region is
// allocated, registered and written at the top of the GPU's memory, for cudaMalloc and VMM
// memory alike. Some stacks fail there (a registration that needs GPU memory of its own).
TEST(GpuMemory, RegionWrittenWithTheGpuNearlyFull) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  constexpr size_t kGiB = size_t{1} << 30;
  constexpr size_t kNeeded = 12 * kGiB;  // the client's 8 GiB region and the server's 4 GiB
  constexpr size_t kRoom = 3 * kGiB;     // two CUDA contexts, and the VMM chunks' rounding
  const CudaMemory before = CudaMemoryOf(0);
  if (before.free < kNeeded + kRoom)
    GTEST_SKIP() << "GPU 0 has only " << before.free / kGiB << " GiB free";
  CudaBuffer filler(before.free - kNeeded - kRoom, 0);
  const CudaMemory filled = CudaMemoryOf(0);
  std::printf("GPU 0: %.1f of %.1f GiB free before, %.1f GiB free beside the filler\n",
              static_cast<double>(before.free) / kGiB, static_cast<double>(before.total) / kGiB,
              static_cast<double>(filled.free) / kGiB);
  for (const std::string memory : {"cuda", "cuda-vmm"}) {
    SCOPED_TRACE(memory);
    testing_support::StageServer server(
        "07_full_p5", "shm", 1,
        {"--memory", memory, "--client-memory", "4g", "--server-memory", "4g"});
    ASSERT_FALSE(server.address().empty());
    testing_support::Result r = testing_support::RunClient(
        "07_full_p5", "shm", server.address(),
        {"--memory", memory, "-S", "2m", "--pages", "512", "--requests", "4", "--json"}, 300s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("\"memory\":\"" + memory + "-"), std::string::npos) << r.out;
    EXPECT_EQ(testing_support::NumberAfter(r.out, "\"verified_bytes\":"), 4LL << 30) << r.out;
    EXPECT_EQ(testing_support::NumberAfter(r.out, "\"registered_bytes\":"), 8LL << 30) << r.out;
    EXPECT_EQ(server.Wait(60s).exit_code, 0);
    std::printf("%s: %s\n", memory.c_str(), r.out.c_str());  // its JSON: registration, rate
  }
}

// A provider that takes GPU memory but copies it through host memory with the CUDA API (tcp
// does, where libfabric has CUDA) is no direct path: "cuda-copied" in the record ("cuda-staged"
// where libfabric has no CUDA), and --gpu-path direct refuses it (exit 77) instead of
// measuring it.
TEST(GpuMemory, CopiedByTheProviderIsNotDirect) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  testing_support::StageServer server("07_full_p5", "tcp", 1, {"--memory", "cuda"});
  ASSERT_FALSE(server.address().empty());
  testing_support::Result r = testing_support::RunClient(
      "07_full_p5", "tcp", server.address(),
      {"--memory", "cuda", "-S", "64k", "--pages", "64", "--json"}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const bool copied = r.out.find("\"memory\":\"cuda-copied\"") != std::string::npos;
  const bool staged = r.out.find("\"memory\":\"cuda-staged\"") != std::string::npos;
  EXPECT_TRUE(copied || staged) << r.out;
  EXPECT_EQ(testing_support::NumberAfter(r.out, "\"verified_bytes\":"), 4 * 64LL * 65536) << r.out;
  EXPECT_EQ(server.Wait(60s).exit_code, 0);
  // The path is chosen before the client reaches for its server.
  testing_support::Result direct = testing_support::RunClient(
      "07_full_p5", "tcp", server.address(),
      {"--memory", "cuda", "--gpu-path", "direct", "-S", "64k", "--pages", "64"}, 60s);
  EXPECT_EQ(direct.exit_code, 77) << direct.out << direct.err;
  EXPECT_NE(direct.err.find("--gpu-path direct: "), std::string::npos) << direct.err;
  std::printf("tcp, GPU memory: %s\n", copied ? "copied by the provider" : "staged");
}
