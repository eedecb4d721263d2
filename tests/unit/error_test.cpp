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
