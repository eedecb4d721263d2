#include <gtest/gtest.h>

#include <rdma/fi_errno.h>

#include <cstring>

#include "cuda_memory.hpp"
#include "error.hpp"

using namespace common;

static int FailingFabricCall() {
  return -FI_ENOMEM;
}
static int FailingHwlocCall() {
  errno = ENOENT;
  return -1;
}

TEST(Checks, FiCheckCarriesFileLineCallAndLibfabricText) {
  try {
    FI_CHECK(FailingFabricCall());
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("FailingFabricCall()"), std::string::npos) << what;
    EXPECT_NE(what.find(fi_strerror(FI_ENOMEM)), std::string::npos) << what;
    EXPECT_EQ(e.exit_code(), kExitFailure);
  }
  EXPECT_NO_THROW(FI_CHECK(0));
  EXPECT_NO_THROW(FI_CHECK(5));  // positive counts are success
}

TEST(Checks, HwlocCheckCarriesErrno) {
  try {
    HWLOC_CHECK(FailingHwlocCall());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FailingHwlocCall()"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos);
  }
}

TEST(Checks, CudaCheckCarriesTheRuntimeText) {
  try {
    CUDA_CHECK(2);  // cudaErrorMemoryAllocation
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
    if (CudaBuilt()) {
      EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
    }
  }
}

TEST(Checks, ExitCodesOfTheExceptionTypes) {
  EXPECT_EQ(UsageError("x").exit_code(), 2);
  EXPECT_EQ(HardwareAbsent("x").exit_code(), 77);
  EXPECT_EQ(Error("x").exit_code(), 1);
}

TEST(Cuda, WithoutAGpuAllocatingIsHardwareAbsent) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    CudaBuffer buffer(4096, 0);
    FAIL();
  } catch (const HardwareAbsent& e) {
    EXPECT_EQ(e.exit_code(), kExitNoHardware);
  }
}

TEST(Cuda, WithoutAGpuVmmAllocatingIsHardwareAbsent) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(CudaBuffer(4096, 0, GpuAllocation::kVmm), HardwareAbsent);
}

// The chunks of VMM memory: whole granules, PyTorch's 20 MiB where that is a whole number of
// them, and enough of them for the size; nothing mapped for nothing.
TEST(Cuda, VmmLayoutRoundsToWholeChunksOfWholeGranules) {
  const size_t mib = 1 << 20;
  VmmLayout one = LayOutVmm(4096, 2 * mib);
  EXPECT_EQ(one.chunk, 20 * mib);
  EXPECT_EQ(one.chunks, 1u);
  EXPECT_EQ(one.mapped, 20 * mib);
  VmmLayout exact = LayOutVmm(40 * mib, 2 * mib);
  EXPECT_EQ(exact.chunks, 2u);
  EXPECT_EQ(exact.mapped, 40 * mib);
  VmmLayout over = LayOutVmm(40 * mib + 1, 2 * mib);
  EXPECT_EQ(over.chunks, 3u);
  EXPECT_EQ(over.mapped, 60 * mib);
  VmmLayout big = LayOutVmm(5ull << 30, 2 * mib);  // 5 GiB: 256 chunks of 20 MiB
  EXPECT_EQ(big.chunks, 256u);
  EXPECT_GE(big.mapped, 5ull << 30);
  VmmLayout odd = LayOutVmm(10 * mib, 6 * mib);  // 20 MiB is no whole number of 6 MiB: 24
  EXPECT_EQ(odd.chunk, 24 * mib);
  EXPECT_EQ(odd.chunks, 1u);
  VmmLayout coarse = LayOutVmm(mib, 64 * mib);  // a granule larger than a chunk: one granule
  EXPECT_EQ(coarse.chunk, 64 * mib);
  EXPECT_EQ(LayOutVmm(0, 2 * mib).chunks, 0u);
  EXPECT_EQ(LayOutVmm(0, 2 * mib).mapped, 0u);
  EXPECT_EQ(LayOutVmm(mib, 0).chunks, 0u);  // no granularity: nothing to lay out
}
