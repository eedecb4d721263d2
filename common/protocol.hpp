// The wire protocol of stages 02 onward (docs/wire-protocol.md): control messages that travel
// by SEND/RECV on lane 0. Every message starts with a fixed header, and the receiver validates
// every field before it acts on one. One definition for all stages, so that a fix to
// validation reaches every stage at once and is unit-tested once.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "error.hpp"

namespace common::wire {

inline constexpr uint32_t kMagic = 0x50444d52;  // "RMDP" on the wire, little-endian
// 2: the header carries a token. 3: messages carry their sender's stage, and what a server
// needs to answer a client of any later version keeps its place (kFirstStableVersion). 4: 07's
// ACCEPT names the server's source pages, and DONE no longer times a fill (pages exist). 5: a
// 07 client may ask immediate data on each lane's last WRITE of a request only.
inline constexpr uint16_t kVersion = 5;
// From this version on, these never move: the header; a CONNECT's first fields (its stage,
// its reply address, its lane count and first lane's address); an ERROR whole. So a server
// can refuse a client of another version by name, and the client read why.
inline constexpr uint16_t kFirstStableVersion = 3;

// The stage a program speaks for (2 for 02_bidirectional ... 7 for 07_full_p5): the leading
// number of its name (common::RunProgram sets it; hostile_peer takes it as an option). Its
// CONNECTs, ACCEPTs and ERRORs carry it, and a client and a server of different stages tell
// each other at once instead of misunderstanding each other.
void SetOwnStage(uint32_t stage);
uint32_t OwnStage();
uint32_t StageOfProgram(const std::string& name);  // "05_queuing" -> 5; 0: no stage
std::string StageName(uint32_t stage);             // 5 -> "05_queuing"

// Limits a receiver enforces (and a sender respects).
inline constexpr size_t kMaxMessageBytes = 64 * 1024;  // every receive buffer has this size
inline constexpr uint32_t kMaxLanes = 64;
inline constexpr uint32_t kMaxAddressBytes = 256;
inline constexpr uint32_t kMaxPagesPerRequest = 8192;
inline constexpr uint64_t kMaxPageBytes = 64ull << 20;
inline constexpr uint64_t kMaxRequestBytes = 1ull << 30;  // server source buffer per request
inline constexpr uint64_t kMaxRepeat = 1ull << 24;
inline constexpr uint64_t kMaxRegionBytes = 1ull << 40;
inline constexpr uint32_t kMaxTextBytes = 4096;  // a TEXT's or REPLY's text (02)

enum class MessageType : uint16_t {
  kConnect = 1,
  kTransfer = 2,
  kError = 3,
  kBye = 4,
  kAccept = 5,
  kDone = 6,
  kText = 7,
  kReply = 8
};

// `token` says whom a message is for, so that a receiver can tell its peer's messages from a
// stranger's even where the provider names no trustworthy sender (shm in libfabric 1.17 credits
// a stranger's messages to a connected peer): a CONNECT carries the client's own random token,
// which every answer of the server's to it carries back; ACCEPT gives the client the session's
// token, which its TRANSFERs and BYE carry. Neither is a secret from whoever reads the wire:
// they keep out strangers that only reach an endpoint, not eavesdroppers.
struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t length;  // of the whole message, header included
  uint32_t token;
};
static_assert(sizeof(Header) == 16);

// Where a client's region lives on one lane: with FI_MR_VIRT_ADDR `address` is the
// region's virtual address, otherwise 0 (offsets start at 0); `key` is what the writer
// passes to fi_write.
struct RemoteRegion {
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t key = 0;
};

struct Lane {
  std::vector<uint8_t> address;  // fi_getname of the client's endpoint on this lane
  RemoteRegion region;           // all 0: no region (a client of 02 asks for no WRITE)
};

// What a client asks of the server's engine (07; earlier stages send the defaults, and their
// servers ignore them). The optimizations are the writer's, but the client is the one that
// benchmarks, so it asks: one server serves clients with different settings side by side.
inline constexpr uint32_t kEnginePin = 1u << 0;    // pin each data thread to a core
inline constexpr uint32_t kEngineShard = 1u << 1;  // per-thread state, no shared lock
inline constexpr uint32_t kEngineLazy = 1u << 2;   // posts enqueue; the CQ poll posts
inline constexpr uint32_t kEngineNuma = 1u << 3;   // memory on each thread's NUMA node
// Immediate data on the last WRITE of each lane's part of a request only (07 --immediate last)
inline constexpr uint32_t kEngineLastImmediate = 1u << 4;
inline constexpr uint32_t kEngineFlags =
    kEnginePin | kEngineShard | kEngineLazy | kEngineNuma | kEngineLastImmediate;
inline constexpr uint32_t kMaxBatch = 1024;
inline constexpr uint32_t kMaxWindow = 1u << 16;  // per lane: the server allocates an Op for each

struct Engine {
  uint32_t flags = 0;
  uint32_t threads = 0;   // data threads; 0: one per topology group
  uint32_t batch = 1;     // WRITEs prepared per visit of a lane in the posting loop
  uint32_t window = 0;    // WRITEs in flight per lane; 0: the server's choice
  uint32_t doorbell = 1;  // WRITEs per doorbell: FI_MORE on all but the last of each group
  uint32_t reserved = 0;
  uint64_t memory = 0;  // bytes of source pages per lane its requests need at once (07)
};

struct Connect {
  uint32_t stage = OwnStage();
  std::vector<Lane> lanes;
  Engine engine;
  // Where the server's answers go: a control endpoint of the client's own (07). Empty: the
  // address of lane 0 (03-06, whose lane 0 carries both messages and WRITEs).
  std::vector<uint8_t> reply;
};

struct Transfer {
  uint32_t request_id = 0;
  uint64_t seed = 0;
  uint64_t page_size = 0;
  uint64_t repeat = 1;
  std::vector<uint32_t> pages;  // page indices into the client's region
};

// An ERROR whose text starts with this refuses a CONNECT for now, not for good: the server has
// no room at the moment (--max-clients), and the client may try again later (exit 75).
inline constexpr std::string_view kBusy = "busy: ";
// An ERROR of request id 0 after ACCEPT whose text starts so: the server dropped the session
// (a client silent past its --peer-timeout, told so that it ends at once when it runs again).
inline constexpr std::string_view kSessionEnded = "session ended: ";
// An ERROR of request id 0 before ACCEPT whose text starts so: the CONNECT is taken, and its
// ACCEPT comes later than a client's --timeout may allow (07 rebuilds its engine for it: the
// ladder's next rung); the client waits kOpeningWait more, once.
inline constexpr std::string_view kWait = "wait: ";
// An ERROR of request id 0 before ACCEPT whose text starts so: the engine the CONNECT asked
// for waits until no client is on, and this session is served by the engine as it is (named
// after it); its ACCEPT follows. A ladder's row then says which engine it measured.
inline constexpr std::string_view kAsIs = "as is: ";
inline constexpr auto kOpeningWait = std::chrono::seconds(120);
struct ErrorReply {
  uint32_t request_id = 0;  // 0 when it concerns no request
  std::string text;
  uint32_t stage = OwnStage();  // the sender's
  uint16_t version = kVersion;  // as its header says: an ERROR reads the same in any version
};

struct Bye {};

// The server's answer to CONNECT: the client's addresses are in its AV now. A client sends
// nothing else before it: a message read together with the CONNECT that introduced its
// sender would otherwise come without a known source (FI_ADDR_NOTAVAIL). 07 names the
// endpoints its WRITEs will come from, one per lane, so the client can tell them from others.
struct Accept {
  std::vector<std::vector<uint8_t>> writers;  // empty before 07
  uint64_t setup_ns = 0;        // 07: what opening the session cost the server (endpoints, memory)
  uint32_t session = 0;         // the token the client's later messages carry (never 0)
  uint32_t stage = OwnStage();  // the server's
  // 07: the bytes of the data set each of the server's source buffers holds, made before any
  // request (common/page_data.hpp, FillSource): what the client verifies its pages against.
  uint64_t source_bytes = 0;
};

// A request the server has finished: its first WRITE posted and its last completed, in the
// server's own clock (nanoseconds; only differences mean anything), so the client can report
// the server's time beside its own.
struct Done {
  uint32_t request_id = 0;
  uint64_t writes = 0;
  uint64_t first_post_ns = 0;
  uint64_t last_completion_ns = 0;
};

// 02's request and answer: a text, and the server's reply to it (the text reversed).
struct Text {
  std::string text;
};
struct Reply {
  std::string text;
};

using Message = std::variant<Connect, Transfer, ErrorReply, Bye, Accept, Done, Text, Reply>;

// The message's name on the wire ("CONNECT", "TEXT", ...), for lines that name one.
const char* NameOf(const Message& message);

// A message that breaks the protocol; the text says which field and value.
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& what) : Error(what) {}
};

// `token` goes into the header (see Header).
std::vector<uint8_t> Encode(const Message& message, uint32_t token = 0);

// Checks header, type, lengths and counts; throws ProtocolError. `token`, when given, receives
// the header's token. An ERROR of another stable version decodes (its `version` says which);
// any other message of another version is refused.
Message Decode(std::span<const uint8_t> bytes, uint32_t* token = nullptr);

// What a server reads of a CONNECT of another version (kFirstStableVersion on), to refuse it
// by name: nullopt when `bytes` are no such CONNECT.
struct ForeignConnect {
  uint16_t version = 0;
  uint32_t token = 0;
  uint32_t stage = 0;
  std::vector<uint8_t> reply;  // the reply address, or the first lane's when none is given
};
std::optional<ForeignConnect> PeekForeignConnect(std::span<const uint8_t> bytes);

// The header's token of `bytes`, without decoding the rest; 0 when they hold no header.
uint32_t TokenOf(std::span<const uint8_t> bytes);
// The header's message type of `bytes`, without decoding the rest (nullopt: no header).
std::optional<MessageType> TypeOf(std::span<const uint8_t> bytes);

// A server's answer (ACCEPT, ERROR) that shows it is of another stage or wire version than
// this program: the line naming both, for the client to end with (exit 2); "" otherwise.
std::string Mismatch(const Message& answer);

// A random token for a CONNECT or a session, never 0 (what a message without one carries).
uint32_t NewToken();

// The messages only a server sends. A server never answers one (two servers, or a server and
// a CONNECT naming its own address, would otherwise answer each other's answers for ever).
bool IsServerMessage(const Message& message);

// Checks a transfer against limits and against the region the client advertised.
void ValidateTransfer(const Transfer& transfer, const RemoteRegion& region);

}  // namespace common::wire
