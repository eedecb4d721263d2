// Taking departed peers out of an address vector (AV), from stage 03 on. Removing a peer is
// not safe on every provider: libfabric 1.17's shm unmaps the peer's region at fi_av_remove,
// while the peer still holds the id it was given, so its next message longer than shm's
// inline size (4 KiB) makes shm read the unmapped region and crash the process, and a later
// peer given the same id inherits the old one's messages (docs/architecture.md, "Provider
// bugs met on the way"; tests/provider/shm_faults.cpp shows it without project code).
// There the last kParked departed peers stay in the AV (shm's holds 256) and the oldest one
// leaves when another departs: a peer gone that long ago is the only one that can still trip
// it, and the session token drops whatever its stale id still delivers. libfabric 2.x's shm
// survives a removed peer's message (the reproducer's test says so), so there peers leave
// at once.
//
// shm 1.17 also names fi_addr_t 0 as the source of a message from a sender not in the AV
// (a stranger's, or a client's first CONNECT). The server's own address takes fi_addr_t 0
// there, inserted before any peer's, so that such a message is credited to nobody it could
// answer (docs/wire-protocol.md, "Answering only who spoke").
//
// One shm 1.17 fault no server can keep clear of: a local process that sends to us and closes
// its endpoint before we read its first message ends us by SIGSEGV in fi_cq_read (shm reads
// the region of a name whose file has gone; tests/provider/shm_faults closed-peer). A server
// over shm 1.x says so when it starts.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <vector>

#include "address.hpp"
#include "error.hpp"
#include "provider_quirks.hpp"

namespace common {

class Departures {
 public:
  static constexpr size_t kParked = 128;

  // Before any peer is inserted into `av`; `own`: the address of the endpoint bound to it.
  Departures(fid_av* av, const fi_info& info, const std::vector<uint8_t>& own)
      : av_(av), format_(info.addr_format), park_(Has(Quirk::kUnmapsRemovedPeer, info)) {
    fi_addr_t self = FI_ADDR_UNSPEC;
    if (Has(Quirk::kStrangerIsAddressZero, info) &&
        (fi_av_insert(av_, own.data(), 1, &self, 0, nullptr) != 1 || self != 0))
      throw Error("shm: our own address did not take fi_addr_t 0 in a new AV");
    if (Has(Quirk::kCrashesOnClosedSender, info))
      std::printf(
          "note: shm %u.%u ends this server if a sender exits unread (README.md, \"When the "
          "provider cannot go on\")\n",
          FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
    if (Has(Quirk::kPeerPlacesForStrangers, info))
      std::printf(
          "note: shm %u.%u gives clients' places away past 256 strangers (README.md, \"When "
          "the provider cannot go on\")\n",
          FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
  }

  // Whether removals wait here instead of reaching the provider at once.
  bool parks() const { return park_; }

  // `address`'s fi_addr_t: the one it has in the AV already, else `insert(address)`'s. An
  // address goes into the AV once: libfabric's AVs count insertions of the same address,
  // and shm's fills up (256) on them although each fi_av_remove unmaps the peer (2.6,
  // smr_av_insert and smr_av_remove): a client's CONNECT, sent again until answered, would
  // otherwise take a place of the AV for good each time. Addresses are the provider's
  // canonical form (CanonicalAddress): another spelling of one is the same entry.
  template <typename Inserter>
  fi_addr_t Insert(const std::vector<uint8_t>& address, Inserter&& insert) {
    const std::vector<uint8_t> key = CanonicalAddress(address, format_);
    if (auto it = book_.find(key); it != book_.end()) return it->second;
    const fi_addr_t id = insert(address);
    book_[key] = id;
    return id;
  }

  // `peer` has gone: out of the AV now, or (shm 1.17) once kParked others have gone after it.
  void Remove(fi_addr_t peer) {
    std::erase(unverified_, peer);
    if (!park_) {
      Leave(peer);
      return;
    }
    Revive(peer);
    parked_.push_back(peer);
    while (parked_.size() > kParked) {
      Leave(parked_.front());
      parked_.pop_front();
    }
  }

  // `peer` came again (the AV gave its address the same fi_addr_t): it is no longer departed.
  void Revive(fi_addr_t peer) {
    std::erase(parked_, peer);
    std::erase(unverified_, peer);
  }

  // `peer` was inserted for a CONNECT that did not come from it, and waits in the AV for one
  // that does. At most kUnverified wait at once, so that CONNECTs naming new addresses cannot
  // fill the AV (shm's holds 256): returns those beyond it, oldest first, to leave now.
  std::vector<fi_addr_t> Unverified(fi_addr_t peer) {
    std::erase(unverified_, peer);
    unverified_.push_back(peer);
    std::vector<fi_addr_t> evicted;
    while (unverified_.size() > kUnverified) {
      evicted.push_back(unverified_.front());
      unverified_.pop_front();
    }
    return evicted;
  }
  static constexpr size_t kUnverified = 64;
  // Whether `peer` still waits for its CONNECT from itself (it stays in the AV meanwhile).
  bool Waiting(fi_addr_t peer) const {
    return std::find(unverified_.begin(), unverified_.end(), peer) != unverified_.end();
  }

 private:
  void Leave(fi_addr_t peer) {
    fi_av_remove(av_, &peer, 1, 0);
    std::erase_if(book_, [&](const auto& entry) { return entry.second == peer; });
  }

  fid_av* av_;
  uint32_t format_;
  std::map<std::vector<uint8_t>, fi_addr_t> book_;  // what is in the AV, by canonical address
  bool park_;
  std::deque<fi_addr_t> parked_;
  std::deque<fi_addr_t> unverified_;
};

}  // namespace common
