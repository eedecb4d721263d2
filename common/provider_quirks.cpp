#include "provider_quirks.hpp"

#include <cstring>

namespace common {

namespace {

constexpr uint32_t kAny = FI_VERSION(1, 0);

// Each row's comment says what the programs do about it, and where.
constexpr QuirkRow kRows[] = {
    // Departures keeps the last 128 departed peers in the AV and lets the oldest go.
    {Quirk::kUnmapsRemovedPeer, "shm", kAny, FI_VERSION(2, 0),
     "fi_av_remove unmaps the peer's region while the peer keeps its id: its next message over "
     "4 KiB makes shm read the unmapped region, and a later peer given the id gets its messages",
     "tests/provider/shm_faults long-message; docs/architecture.md, \"Provider bugs met on "
     "the way\""},
    // Departures inserts the server's own address first, so 0 is nobody it could answer.
    {Quirk::kStrangerIsAddressZero, "shm", kAny, FI_VERSION(2, 0),
     "a message from a sender not in the AV is reported from fi_addr_t 0",
     "docs/wire-protocol.md, \"Answering only who spoke\""},
    // A server says so when it starts; the crash line names it as the likely cause.
    {Quirk::kCrashesOnClosedSender, "shm", kAny, FI_VERSION(2, 0),
     "a local process that sends and closes its endpoint before its message is read ends the "
     "reader by SIGSEGV in fi_cq_read (shm reads the region of a name whose file has gone)",
     "tests/provider/shm_faults closed-peer"},
    // 07's data thread keeps such an entry (one per never-answered client) instead.
    {Quirk::kRemoveNeedsMappedPeer, "shm", kAny, FI_VERSION(2, 0),
     "fi_av_remove unmaps without checking the peer was mapped: removing one whose process had "
     "gone before it was inserted dereferences NULL",
     "2.6 checks: prov/shm/src/smr_av.c, smr_unmap_region"},
    // No branch: no stage sends first to an address that has not spoken to it from itself
    // (docs/wire-protocol.md, "Answering only who spoke"), which keeps every provider clear.
    {Quirk::kStaleIdOfKilledPeer, "shm", kAny, 0,
     "a killed peer cannot clear the id it gave the reader, and fi_av_remove does not: when its "
     "AV slot comes round to an address that has not spoken, shm sends through a null region "
     "(SIGSEGV in fi_send, smr_generic_sendmsg)",
     "tests/provider/shm_faults killed-peer; 2.6 prov/shm/src/smr_av.c, smr_map_del"},
    // A server says so when it starts (README.md, "When the provider cannot go on").
    {Quirk::kPeerPlacesForStrangers, "shm", FI_VERSION(2, 6), 0,
     "every process that writes to an endpoint takes one of its 256 peer places, given back "
     "only by fi_av_remove of an address the reader inserted: a stranger's never",
     "tests/provider/shm_faults strangers (1.17 holds)"},
    // 07 ends a server whose lane a dead client's WRITE holds, and says why.
    {Quirk::kCompletesInOrder, "shm", kAny, FI_VERSION(1, 18),
     "an endpoint's WRITE responses are read in order, stopping at the first pending: a WRITE "
     "to a killed client is never answered and no later WRITE of that endpoint completes",
     "measured: a live second client got none of its completions after the first was killed"},
    // 07 asks FI_DELIVERY_COMPLETE there (WriteCompletion), so the window bounds what is in
    // flight: without it, 0.92-3.83 M WRITEs/s, bimodal; with it 3.15-3.24 (2.6, 2 cores,
    // 4 KiB, one lane). Not asked elsewhere: it costs 1.17's shm and tcp;ofi_rxm a third.
    {Quirk::kCompletesBeforeDelivery, "shm", FI_VERSION(1, 18), 0,
     "a WRITE of up to 4 KiB is copied into the writer's buffer and completed at once; the "
     "target's queue takes commands without a lock, so one progress call of the target's goes "
     "on while the writer keeps it full, and its CQ overflows into allocations",
     "2.6 prov/shm/src/smr_rma.c, smr_generic_rma: smr_complete_tx once queued unless "
     "SMR_RETURN_CMD; measured (2.6, 2 cores)"},
    // 07 admits a newcomer only if its window fits beside every command held or promised.
    {Quirk::kHoldsCommandUntilAnswered, "shm", FI_VERSION(1, 18), 0,
     "a WRITE asking FI_DELIVERY_COMPLETE takes one of tx_attr->size commands until the "
     "target answers: a WRITE to a killed client keeps its command for good",
     "2.6 prov/shm/src/smr_rma.c, smr_generic_rma (SMR_RETURN_CMD); measured: the 16th "
     "client killed at -W 64 left the lane no command"},
    // --doorbell saves doorbells only here; elsewhere the writer says it saves none.
    {Quirk::kReadsMore, "efa", kAny, 0,
     "a WRITE posted with FI_MORE waits for the next post without it, which rings the "
     "device's doorbell once (shm, tcp and rxm send each WRITE as it is posted)",
     "2.6 prov/efa/src/efa_data_path_ops.h (ibv_wr_complete)"},
    // What 07 calls its GPU path over tcp: copied by the provider, not GPUDirect RDMA.
    {Quirk::kCopiesGpuThroughSockets, "tcp;ofi_rxm", kAny, 0,
     "takes GPU memory (FI_HMEM) and copies it between the GPU and its sockets' host buffers "
     "itself; it accepts FI_OPT_CUDA_API_PERMITTED false (rxm's direct send hands the GPU "
     "buffer to tcp), but no NIC reads GPU memory",
     "2.6 prov/rxm/src/rxm_ep.c, rxm_ep_setopt (FI_OPT_CUDA_API_PERMITTED); prov/tcp sends "
     "through the kernel's sockets"},
    // 07 --immediate last: a WRITE its lane's last one vouches for need not ask
    // FI_DELIVERY_COMPLETE here (elsewhere it does: efa's SRD delivers in no set order).
    {Quirk::kDeliversInOrder, "tcp;ofi_rxm", kAny, 0,
     "a peer's WRITEs go over one connection and land in the order posted",
     "2.6 prov/rxm/src/rxm_rma.c (WRITEs on the peer's one msg endpoint); prov/tcp: one "
     "socket, read in order"},
    {Quirk::kDeliversInOrder, "shm", kAny, FI_VERSION(1, 18),
     "a WRITE without immediate data is copied by the writer as it is posted "
     "(process_vm_writev), one with it through the peer's command queue, read in order",
     "1.17 prov/shm/src/smr_rma.c, smr_rma_fast; measured: --immediate last asking "
     "FI_DELIVERY_COMPLETE moved 0.003 M WRITEs/s"},
};

}  // namespace

std::span<const QuirkRow> Quirks() {
  return kRows;
}

bool Has(Quirk quirk, const char* provider, uint32_t version) {
  for (const QuirkRow& row : kRows)
    if (row.quirk == quirk && provider != nullptr && std::strcmp(row.provider, provider) == 0 &&
        version >= row.from && (row.until == 0 || version < row.until))
      return true;
  return false;
}

bool Has(Quirk quirk, const fi_info& info) {
  return Has(quirk, info.fabric_attr ? info.fabric_attr->prov_name : nullptr, fi_version());
}

}  // namespace common
