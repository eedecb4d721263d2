#include <gtest/gtest.h>

#include <algorithm>
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

// A request's pages spread over lanes, page i in lane i % lanes: each checked in its own
// lane's region, the first bad byte named by request page, region page and offset.
TEST(PageData, VerifyPagesChecksEachInItsLane) {
  const uint64_t page_size = 100, seed = 11;
  const std::vector<uint32_t> pages = {3, 0, 2, 1};
  std::vector<std::vector<uint8_t>> regions(2, std::vector<uint8_t>(4 * page_size));
  for (size_t i = 0; i < pages.size(); ++i)
    FillPage(std::span(regions[i % 2]).subspan(pages[i] * page_size, page_size), seed, pages[i]);
  std::vector<std::span<const uint8_t>> lanes(regions.begin(), regions.end());
  EXPECT_EQ(VerifyPages(lanes, pages, page_size, seed), pages.size() * page_size);
  EXPECT_THROW(VerifyPages(lanes[0], pages, page_size, seed), Error);  // one lane: wrong place
  regions[1][2 * page_size + 7] ^= 1;  // request page 2 is region page 2, in lane 0: untouched
  EXPECT_EQ(VerifyPages(lanes, pages, page_size, seed), pages.size() * page_size);
  regions[1][1 * page_size + 7] ^= 1;  // request page 3 is region page 1, in lane 1
  try {
    VerifyPages(lanes, pages, page_size, seed);
    FAIL() << "a bad byte went unnoticed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "verification failed: page 3 (region page 1) differs at byte offset 7");
  }
}

// 07's data set reads the same whatever piece is made at a time, at any byte offset: the server
// makes it a chunk at a time, and a page of any size may start anywhere in it.
TEST(SourcePages, AnyPieceReadsAsTheWhole) {
  std::vector<uint8_t> whole(1000);
  FillSource(whole, 0);
  EXPECT_NE(std::set<uint8_t>(whole.begin(), whole.end()).size(), 1u);
  for (size_t at : {0u, 1u, 7u, 8u, 13u, 500u})
    for (size_t n : {1u, 3u, 8u, 9u, 487u}) {
      std::vector<uint8_t> piece(n);
      FillSource(piece, at);
      EXPECT_TRUE(std::equal(piece.begin(), piece.end(), whole.begin() + at)) << at << " " << n;
    }
}

// Page x of a request with seed s comes from source page (x + s) mod S: inside the data set,
// another seed another source page, and what the server wrote from there verifies.
TEST(SourcePages, PagesComeFromTheirSourceAndVerify) {
  const uint64_t page_size = 24, source_bytes = 10 * page_size + 5, seed = 3;  // 10 pages fit
  EXPECT_EQ(SourceOffset(seed, 0, page_size, source_bytes), 3 * page_size);
  EXPECT_EQ(SourceOffset(seed, 8, page_size, source_bytes), 1 * page_size);  // (8 + 3) mod 10
  EXPECT_EQ(SourceOffset(seed + 10, 8, page_size, source_bytes), 1 * page_size);
  EXPECT_NE(SourceOffset(seed + 1, 8, page_size, source_bytes), 1 * page_size);
  std::vector<uint8_t> source(source_bytes);
  FillSource(source, 0);
  const std::vector<uint32_t> pages = {5, 0, 7, 2};
  std::vector<std::vector<uint8_t>> regions(2, std::vector<uint8_t>(8 * page_size));
  for (size_t i = 0; i < pages.size(); ++i) {  // the WRITEs: page i in lane i % 2
    const uint64_t from = SourceOffset(seed, pages[i], page_size, source_bytes);
    std::copy_n(source.begin() + from, page_size, regions[i % 2].begin() + pages[i] * page_size);
  }
  std::vector<std::span<const uint8_t>> lanes(regions.begin(), regions.end());
  EXPECT_EQ(VerifySourcePages(lanes, pages, page_size, seed, source_bytes), 4 * page_size);
  EXPECT_THROW(VerifySourcePages(lanes, pages, page_size, seed + 1, source_bytes), Error);
  EXPECT_THROW(VerifySourcePages(lanes, pages, page_size, seed, page_size - 1), Error);
  regions[0][7 * page_size + 20] ^= 1;  // request page 2: region page 7, from source page 0
  try {
    VerifySourcePages(lanes, pages, page_size, seed, source_bytes);
    FAIL() << "a bad byte went unnoticed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "verification failed: page 2 (region page 7, source page 0) differs at byte "
                 "offset 20");
  }
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
