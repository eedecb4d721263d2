#include <gtest/gtest.h>

#include <set>

#include "error.hpp"
#include "page_data.hpp"

using namespace common;

TEST(PageData, FillIsDeterministicAndVerifies) {
  for (size_t size : {1u, 7u, 8u, 13u, 4096u, 65536u + 3}) {
    std::vector<uint8_t> a(size), b(size);
    FillPage(a, 42, 7);
    FillPage(b, 42, 7);
    EXPECT_EQ(a, b);
    EXPECT_EQ(VerifyPage(a, 42, 7), kPageOk);
  }
}

TEST(PageData, DifferentPagesAndSeedsDiffer) {
  std::vector<uint8_t> a(4096), b(4096), c(4096);
  FillPage(a, 1, 0);
  FillPage(b, 1, 1);
  FillPage(c, 2, 0);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(VerifyPage(a, 1, 1), kPageOk);
  EXPECT_NE(VerifyPage(a, 2, 0), kPageOk);
}

TEST(PageData, VerifyNamesTheFirstBadByte) {
  for (size_t bad : {0u, 5u, 8u, 4095u, 4100u}) {
    std::vector<uint8_t> page(4101);
    FillPage(page, 3, 9);
    page[bad] ^= 1;
    EXPECT_EQ(VerifyPage(page, 3, 9), bad);
  }
  std::vector<uint8_t> zeros(4096, 0);
  EXPECT_EQ(VerifyPage(zeros, 3, 9), 0u);  // never all zeros
}

TEST(SamplePages, DistinctInRangeAndDeterministic) {
  for (auto [count, region] :
       {std::pair<size_t, size_t>{10, 10}, {100, 200}, {1000, 100000}, {8192, 16384}, {1, 1}}) {
    auto pages = SamplePages(5, count, region);
    ASSERT_EQ(pages.size(), count);
    std::set<uint32_t> distinct(pages.begin(), pages.end());
    EXPECT_EQ(distinct.size(), count);
    EXPECT_LT(*distinct.rbegin(), region);
    EXPECT_EQ(SamplePages(5, count, region), pages);
  }
  EXPECT_NE(SamplePages(5, 100, 1000), SamplePages(6, 100, 1000));
  // Scattered, not simply 0..n-1 in order.
  auto pages = SamplePages(5, 100, 200);
  EXPECT_FALSE(std::is_sorted(pages.begin(), pages.end()));
  EXPECT_THROW(SamplePages(1, 11, 10), UsageError);
}
