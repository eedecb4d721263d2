#include "page_data.hpp"

#include "error.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <unordered_set>

namespace common {

// splitmix64: a fast, well-mixed function of a counter.
static inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline uint64_t Word(uint64_t key, uint64_t i) {
  return Mix(key + i);
}

static inline uint64_t PageKey(uint64_t seed, uint64_t page_index) {
  return Mix(seed ^ Mix(page_index)) << 20;  // distinct pages start far apart
}

void FillPage(std::span<uint8_t> page, uint64_t seed, uint64_t page_index) {
  const uint64_t key = PageKey(seed, page_index);
  const size_t words = page.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = Word(key, i);
    std::memcpy(page.data() + 8 * i, &w, 8);
  }
  if (size_t tail = page.size() % 8) {
    uint64_t w = Word(key, words);
    std::memcpy(page.data() + 8 * words, &w, tail);
  }
}

size_t VerifyPage(std::span<const uint8_t> page, uint64_t seed, uint64_t page_index) {
  const uint64_t key = PageKey(seed, page_index);
  const size_t words = page.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t want = Word(key, i), got;
    std::memcpy(&got, page.data() + 8 * i, 8);
    if (got != want) {
      for (size_t b = 0; b < 8; ++b)
        if (((got ^ want) >> (8 * b)) & 0xff) return 8 * i + b;
    }
  }
  if (size_t tail = page.size() % 8) {
    uint64_t want = Word(key, words), got = 0;
    std::memcpy(&got, page.data() + 8 * words, tail);
    for (size_t b = 0; b < tail; ++b)
      if (((got ^ want) >> (8 * b)) & 0xff) return 8 * words + b;
  }
  return kPageOk;
}

uint64_t VerifyPages(std::span<const std::span<const uint8_t>> lanes,
                     std::span<const uint32_t> pages, uint64_t page_size, uint64_t seed) {
  for (size_t i = 0; i < pages.size(); ++i) {
    std::span<const uint8_t> region = lanes[i % lanes.size()];
    size_t bad = VerifyPage(region.subspan(pages[i] * page_size, page_size), seed, pages[i]);
    if (bad != kPageOk)
      throw Error("verification failed: page " + std::to_string(i) + " (region page " +
                  std::to_string(pages[i]) + ") differs at byte offset " + std::to_string(bad));
  }
  return pages.size() * page_size;
}

// The data set's stream: a key of its own, so no page of FillPage's reads the same.
constexpr uint64_t kSourceKey = 0x50414745534f5552ull;  // "RUOSEGAP"

void FillSource(std::span<uint8_t> bytes, uint64_t offset) {
  size_t i = 0;
  if (offset % 8 != 0) {  // a head up to the next word
    const uint64_t w = Word(kSourceKey, offset / 8);
    for (; i < bytes.size() && (offset + i) % 8 != 0; ++i)
      bytes[i] = static_cast<uint8_t>(w >> (8 * ((offset + i) % 8)));
  }
  uint64_t word = (offset + i) / 8;
  for (; i + 8 <= bytes.size(); i += 8, ++word) {
    const uint64_t w = Word(kSourceKey, word);
    std::memcpy(bytes.data() + i, &w, 8);
  }
  if (i < bytes.size()) {
    const uint64_t w = Word(kSourceKey, word);
    std::memcpy(bytes.data() + i, &w, bytes.size() - i);
  }
}

uint64_t SourceOffset(uint64_t seed, uint32_t page, uint64_t page_size, uint64_t source_bytes) {
  const uint64_t pages = source_bytes / page_size;
  return ((page % pages + seed % pages) % pages) * page_size;
}

uint64_t VerifySourcePages(std::span<const std::span<const uint8_t>> lanes,
                           std::span<const uint32_t> pages, uint64_t page_size, uint64_t seed,
                           uint64_t source_bytes) {
  if (page_size == 0 || source_bytes < page_size)
    throw Error("the server's source pages (" + std::to_string(source_bytes) +
                " bytes) hold no page of " + std::to_string(page_size));
  std::vector<uint8_t> want(std::min<uint64_t>(page_size, 1 << 20));
  for (size_t i = 0; i < pages.size(); ++i) {
    std::span<const uint8_t> page =
        lanes[i % lanes.size()].subspan(pages[i] * page_size, page_size);
    const uint64_t from = SourceOffset(seed, pages[i], page_size, source_bytes);
    for (uint64_t at = 0; at < page_size; at += want.size()) {  // a chunk at a time
      const size_t n = static_cast<size_t>(std::min<uint64_t>(want.size(), page_size - at));
      FillSource({want.data(), n}, from + at);
      if (std::memcmp(want.data(), page.data() + at, n) == 0) continue;
      size_t bad = 0;
      while (want[bad] == page[at + bad]) ++bad;
      throw Error("verification failed: page " + std::to_string(i) + " (region page " +
                  std::to_string(pages[i]) + ", source page " + std::to_string(from / page_size) +
                  ") differs at byte offset " + std::to_string(at + bad));
    }
  }
  return pages.size() * page_size;
}

std::vector<uint32_t> SamplePages(uint64_t seed, size_t count, size_t region_pages) {
  if (count > region_pages)
    throw UsageError("cannot choose " + std::to_string(count) + " distinct pages out of " +
                     std::to_string(region_pages));
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> pages;
  pages.reserve(count);
  if (count * 4 >= region_pages) {
    // Dense: shuffle the whole range and keep a prefix.
    std::vector<uint32_t> all(region_pages);
    std::iota(all.begin(), all.end(), 0u);
    for (size_t i = 0; i < count; ++i) {
      std::uniform_int_distribution<size_t> pick(i, region_pages - 1);
      std::swap(all[i], all[pick(rng)]);
      pages.push_back(all[i]);
    }
  } else {
    // Sparse: draw and reject repeats.
    std::unordered_set<uint32_t> seen;
    std::uniform_int_distribution<uint32_t> pick(0, static_cast<uint32_t>(region_pages - 1));
    while (pages.size() < count) {
      uint32_t p = pick(rng);
      if (seen.insert(p).second) pages.push_back(p);
    }
  }
  return pages;
}

}  // namespace common
