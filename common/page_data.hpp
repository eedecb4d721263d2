// Deterministic page contents and page choice: both sides regenerate them from the seed,
// so the receiver can check every byte without the data ever being sent twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace common {

// Fills `page` with the bytes of page `page_index` of the data set `seed`.
void FillPage(std::span<uint8_t> page, uint64_t seed, uint64_t page_index);

// Offset of the first byte that differs from FillPage's, or kPageOk.
inline constexpr size_t kPageOk = static_cast<size_t>(-1);
size_t VerifyPage(std::span<const uint8_t> page, uint64_t seed, uint64_t page_index);

// Checks the pages of a request against the seed's data: page i of it sits at
// pages[i] x page_size in the region of lane i % lanes.size() (one region: one lane). Throws
// common::Error naming the first bad byte; returns the bytes checked.
uint64_t VerifyPages(std::span<const std::span<const uint8_t>> lanes,
                     std::span<const uint32_t> pages, uint64_t page_size, uint64_t seed);
inline uint64_t VerifyPages(std::span<const uint8_t> region, std::span<const uint32_t> pages,
                            uint64_t page_size, uint64_t seed) {
  return VerifyPages({&region, 1}, pages, page_size, seed);
}

// 07's source pages (docs/architecture.md, "Memory"): the pages a server moves exist before
// any request, as the published engine moved a resident KV cache. Its source memory holds one
// data set, made once at start: byte o of it is byte o % 8 of word o / 8 of a fixed stream.
// Page x of a request with seed s is written from source page (x + s) mod S, S the source
// pages of that size the data set holds, so a request's WRITEs only read, and every client
// can check what landed without the server making anything for it.
void FillSource(std::span<uint8_t> bytes, uint64_t offset);  // data set bytes [offset, +size)
uint64_t SourceOffset(uint64_t seed, uint32_t page, uint64_t page_size, uint64_t source_bytes);
// As VerifyPages, against the source pages a server of `source_bytes` wrote from.
uint64_t VerifySourcePages(std::span<const std::span<const uint8_t>> lanes,
                           std::span<const uint32_t> pages, uint64_t page_size, uint64_t seed,
                           uint64_t source_bytes);

// `count` distinct page indices in [0, region_pages), in random order, from the seed.
std::vector<uint32_t> SamplePages(uint64_t seed, size_t count, size_t region_pages);

}  // namespace common
