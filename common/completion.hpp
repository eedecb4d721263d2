// Reading a completion queue, as every stage from 02 on does (01 teaches it; from 02 on it no
// longer changes, so it lives here once). Completions are read in batches, and each one is
// handed to the caller's function directly: no allocation and no std::function per completion.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <cstddef>
#include <string>

#include "error.hpp"
#include "provider_watch.hpp"

namespace common {

inline constexpr size_t kCqBatch = 32;  // completions read per fi_cq_read

// A completion in error: the operation it belongs to (its context; null for an operation the
// peer started), what failed (-FI_Exxx as a positive FI_Exxx) and the provider's own words.
struct CompletionError {
  void* op_context = nullptr;
  uint64_t flags = 0;
  int err = 0;
  std::string text;  // "Truncation error (...)": fi_strerror and fi_cq_strerror
};

// Reads the error entry that made fi_cq_read return -FI_EAVAIL.
CompletionError ReadCompletionError(fid_cq* cq);

// A completion of a remote write into our memory (with immediate data): fi_cq(3) marks it
// FI_REMOTE_WRITE (with FI_RMA); no operation of ours was posted for it, so it has no context.
inline bool IsRemoteWrite(const fi_cq_data_entry& entry) {
  return (entry.flags & FI_REMOTE_WRITE) != 0;
}

// Reads up to kCqBatch completions: on_done(entry, source) for each, or on_error(error) for
// one in error. `source` is the sender's fi_addr_t (FI_ADDR_NOTAVAIL when it is not in our
// AV) with `from` (fi_cq_readfrom: endpoints opened with FI_SOURCE), else FI_ADDR_UNSPEC.
// Returns how many it handed over.
template <typename OnDone, typename OnError>
size_t ReadCompletions(fid_cq* cq, bool from, OnDone&& on_done, OnError&& on_error) {
  fi_cq_data_entry entries[kCqBatch];
  fi_addr_t sources[kCqBatch];
  ssize_t n = 0;
  {
    const InProvider inside("fi_cq_read");  // shm spins in it for good on a message too long
    n = from ? fi_cq_readfrom(cq, entries, kCqBatch, sources) : fi_cq_read(cq, entries, kCqBatch);
  }
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    on_error(ReadCompletionError(cq));
    return 1;
  }
  FI_CHECK(n);
  for (ssize_t i = 0; i < n; ++i) on_done(entries[i], from ? sources[i] : FI_ADDR_UNSPEC);
  return static_cast<size_t>(n);
}

}  // namespace common
