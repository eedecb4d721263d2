// What a provider does, at some libfabric versions, that the API does not promise and the
// programs must meet: one table (provider_quirks.cpp), a row per behaviour, with the provider,
// the versions, what it does and where it was found (libfabric's source, a reproducer in
// tests/provider, a measurement). Code asks Has(Quirk::kX, info) and says what it does about
// it; a new libfabric that behaves otherwise changes one row.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <span>

namespace common {

enum class Quirk {
  kUnmapsRemovedPeer,          // fi_av_remove unmaps a peer that may still send (Departures)
  kStrangerIsAddressZero,      // a sender not in the AV is named fi_addr_t 0 (Departures)
  kCrashesOnClosedSender,      // a sender closed before its message was read crashes fi_cq_read
  kRemoveNeedsMappedPeer,      // fi_av_remove of a peer never mapped dereferences NULL
  kStaleIdOfKilledPeer,        // a killed peer's id, left behind, breaks a later send
  kPeerPlacesForStrangers,     // every sender takes one of 256 peer places, strangers for good
  kCompletesInOrder,           // an endpoint's WRITEs complete in order: a lost one holds all
  kCompletesBeforeDelivery,    // a small WRITE completes before its target has it
  kHoldsCommandUntilAnswered,  // a delivery-complete WRITE holds a command until answered
  kReadsMore,                  // FI_MORE on a WRITE is read: the doorbell waits for the last
  kCopiesGpuThroughSockets,    // takes GPU memory, copies it through host buffers itself
  kDeliversInOrder,            // an endpoint's WRITEs to a peer land in the order posted
};

struct QuirkRow {
  Quirk quirk;
  const char* provider;   // fabric_attr->prov_name
  uint32_t from;          // FI_VERSION of the first libfabric with it
  uint32_t until;         // the first without it; 0: every version since `from`
  const char* behaviour;  // what it does, in a line
  const char* found;      // where: libfabric's source, a reproducer, a measurement
};

std::span<const QuirkRow> Quirks();
bool Has(Quirk quirk, const char* provider, uint32_t version);
// For the provider of `info`, at the libfabric this process runs on.
bool Has(Quirk quirk, const fi_info& info);

}  // namespace common
