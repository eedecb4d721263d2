#include "protocol.hpp"

#include <atomic>
#include <cctype>
#include <cstring>
#include <iterator>
#include <random>
#include <type_traits>

namespace common::wire {

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void PutBytes(std::span<const uint8_t> b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : bytes_(b) {}
  template <typename T>
  T Get(const char* field) {
    if (bytes_.size() - at_ < sizeof(T))
      throw ProtocolError(std::string("message ends inside field '") + field + "'");
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::span<const uint8_t> GetBytes(size_t n, const char* field) {
    if (bytes_.size() - at_ < n)
      throw ProtocolError(std::string("message ends inside field '") + field + "'");
    auto b = bytes_.subspan(at_, n);
    at_ += n;
    return b;
  }
  void ExpectEnd() const {
    if (at_ != bytes_.size())
      throw ProtocolError(std::to_string(bytes_.size() - at_) +
                          " unexpected bytes after the message");
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

template <typename T>
void CheckAtMost(T value, T limit, const char* field) {
  if (value > limit)
    throw ProtocolError(std::string(field) + " " + std::to_string(value) + " is over the limit " +
                        std::to_string(limit));
}

// A TEXT's or REPLY's text: its length, then its bytes.
void PutText(Writer& w, const std::string& text) {
  if (text.size() > kMaxTextBytes)
    throw ProtocolError("text of " + std::to_string(text.size()) + " bytes is over the limit " +
                        std::to_string(kMaxTextBytes));
  w.Put(static_cast<uint32_t>(text.size()));
  w.PutBytes({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}
std::string GetText(Reader& r) {
  const auto n = r.Get<uint32_t>("text length");
  CheckAtMost(n, kMaxTextBytes, "text length");
  auto text = r.GetBytes(n, "text");
  return {text.begin(), text.end()};
}

}  // namespace

std::vector<uint8_t> Encode(const Message& message, uint32_t token) {
  Writer w;
  w.Put(Header{});
  uint16_t type = 0;
  if (auto* c = std::get_if<Connect>(&message)) {
    type = static_cast<uint16_t>(MessageType::kConnect);
    w.Put(c->stage);  // the stable part: stage, reply address, lane count, first address
    w.Put(static_cast<uint32_t>(c->reply.size()));
    w.PutBytes(c->reply);
    w.Put(static_cast<uint32_t>(c->lanes.size()));
    for (const auto& lane : c->lanes) {
      w.Put(static_cast<uint32_t>(lane.address.size()));
      w.PutBytes(lane.address);
      w.Put(lane.region);
    }
    w.Put(c->engine);
  } else if (auto* t = std::get_if<Transfer>(&message)) {
    type = static_cast<uint16_t>(MessageType::kTransfer);
    w.Put(t->request_id);
    w.Put(static_cast<uint32_t>(t->pages.size()));
    w.Put(t->seed);
    w.Put(t->page_size);
    w.Put(t->repeat);
    for (uint32_t p : t->pages) w.Put(p);
  } else if (auto* e = std::get_if<ErrorReply>(&message)) {
    type = static_cast<uint16_t>(MessageType::kError);
    w.Put(e->request_id);
    w.Put(e->stage);
    const size_t room = kMaxMessageBytes - sizeof(Header) - 12;  // request id, stage, length
    const std::string text = e->text.substr(0, room);
    w.Put(static_cast<uint32_t>(text.size()));
    w.PutBytes({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  } else if (auto* a = std::get_if<Accept>(&message)) {
    type = static_cast<uint16_t>(MessageType::kAccept);
    w.Put(static_cast<uint32_t>(a->writers.size()));
    for (const auto& address : a->writers) {
      w.Put(static_cast<uint32_t>(address.size()));
      w.PutBytes(address);
    }
    w.Put(a->setup_ns);
    w.Put(a->session);
    w.Put(a->stage);
    w.Put(a->source_bytes);
  } else if (auto* d = std::get_if<Done>(&message)) {
    type = static_cast<uint16_t>(MessageType::kDone);
    w.Put(d->request_id);
    w.Put(uint32_t{0});
    w.Put(d->writes);
    w.Put(d->first_post_ns);
    w.Put(d->last_completion_ns);
  } else if (auto* x = std::get_if<Text>(&message)) {
    type = static_cast<uint16_t>(MessageType::kText);
    PutText(w, x->text);
  } else if (auto* y = std::get_if<Reply>(&message)) {
    type = static_cast<uint16_t>(MessageType::kReply);
    PutText(w, y->text);
  } else {
    type = static_cast<uint16_t>(MessageType::kBye);
  }
  const uint16_t version = type == static_cast<uint16_t>(MessageType::kError)
                               ? std::get<ErrorReply>(message).version
                               : kVersion;
  Header h{kMagic, version, type, static_cast<uint32_t>(w.bytes.size()), token};
  std::memcpy(w.bytes.data(), &h, sizeof(h));
  if (w.bytes.size() > kMaxMessageBytes)
    throw ProtocolError("message of " + std::to_string(w.bytes.size()) +
                        " bytes is over the limit " + std::to_string(kMaxMessageBytes));
  return std::move(w.bytes);
}

Message Decode(std::span<const uint8_t> bytes, uint32_t* token) {
  Reader r(bytes);
  const auto h = r.Get<Header>("header");
  if (token != nullptr) *token = h.token;
  if (h.magic != kMagic) throw ProtocolError("wrong magic " + std::to_string(h.magic));
  if (h.length != bytes.size())
    throw ProtocolError("header says " + std::to_string(h.length) + " bytes but " +
                        std::to_string(bytes.size()) + " arrived");
  const bool stable_error =
      h.version >= kFirstStableVersion && static_cast<MessageType>(h.type) == MessageType::kError;
  if (h.version != kVersion && !stable_error)
    throw ProtocolError("wire version " + std::to_string(h.version) + " (this program speaks " +
                        std::to_string(kVersion) + ")");
  switch (static_cast<MessageType>(h.type)) {
    case MessageType::kConnect: {
      Connect c;
      c.stage = r.Get<uint32_t>("stage");
      const auto reply = r.Get<uint32_t>("reply address length");
      CheckAtMost(reply, kMaxAddressBytes, "reply address length");
      auto reply_bytes = r.GetBytes(reply, "reply address");
      c.reply.assign(reply_bytes.begin(), reply_bytes.end());
      const auto lanes = r.Get<uint32_t>("lane count");
      if (lanes == 0) throw ProtocolError("lane count 0");
      CheckAtMost(lanes, kMaxLanes, "lane count");
      for (uint32_t i = 0; i < lanes; ++i) {
        Lane lane;
        const auto n = r.Get<uint32_t>("address length");
        if (n == 0) throw ProtocolError("address length 0");
        CheckAtMost(n, kMaxAddressBytes, "address length");
        auto a = r.GetBytes(n, "address");
        lane.address.assign(a.begin(), a.end());
        lane.region = r.Get<RemoteRegion>("region");
        const RemoteRegion none{};
        if (lane.region.length == 0 &&
            (lane.region.address != none.address || lane.region.key != none.key))
          throw ProtocolError("region length 0");
        CheckAtMost(lane.region.length, kMaxRegionBytes, "region length");
        if (lane.region.address > UINT64_MAX - lane.region.length)
          throw ProtocolError("region address + length overflows");
        c.lanes.push_back(std::move(lane));
      }
      c.engine = r.Get<Engine>("engine");
      if (c.engine.flags & ~kEngineFlags)
        throw ProtocolError("unknown engine flags " + std::to_string(c.engine.flags));
      CheckAtMost(c.engine.threads, kMaxLanes, "engine threads");
      if (c.engine.batch == 0) throw ProtocolError("engine batch 0");
      CheckAtMost(c.engine.batch, kMaxBatch, "engine batch");
      if (c.engine.doorbell == 0) throw ProtocolError("engine doorbell 0");
      CheckAtMost(c.engine.doorbell, kMaxBatch, "engine doorbell");
      CheckAtMost(c.engine.window, kMaxWindow, "engine window");
      CheckAtMost(c.engine.memory, kMaxRegionBytes, "engine memory");
      r.ExpectEnd();
      return c;
    }
    case MessageType::kTransfer: {
      Transfer t;
      t.request_id = r.Get<uint32_t>("request id");
      const auto count = r.Get<uint32_t>("page count");
      t.seed = r.Get<uint64_t>("seed");
      t.page_size = r.Get<uint64_t>("page size");
      t.repeat = r.Get<uint64_t>("repeat");
      if (count == 0) throw ProtocolError("page count 0");
      CheckAtMost(count, kMaxPagesPerRequest, "page count");
      t.pages.resize(count);
      for (auto& p : t.pages) p = r.Get<uint32_t>("page index");
      r.ExpectEnd();
      return t;
    }
    case MessageType::kError: {
      ErrorReply e;
      e.version = h.version;
      e.request_id = r.Get<uint32_t>("request id");
      e.stage = r.Get<uint32_t>("stage");
      const auto n = r.Get<uint32_t>("text length");
      auto text = r.GetBytes(n, "text");
      e.text.assign(text.begin(), text.end());
      r.ExpectEnd();
      return e;
    }
    case MessageType::kBye:
      r.ExpectEnd();
      return Bye{};
    case MessageType::kText: {
      Text x{GetText(r)};
      r.ExpectEnd();
      return x;
    }
    case MessageType::kReply: {
      Reply y{GetText(r)};
      r.ExpectEnd();
      return y;
    }
    case MessageType::kAccept: {
      Accept a;
      const auto n = r.Get<uint32_t>("writer count");
      CheckAtMost(n, kMaxLanes, "writer count");
      for (uint32_t i = 0; i < n; ++i) {
        const auto length = r.Get<uint32_t>("address length");
        if (length == 0) throw ProtocolError("address length 0");
        CheckAtMost(length, kMaxAddressBytes, "address length");
        auto address = r.GetBytes(length, "address");
        a.writers.emplace_back(address.begin(), address.end());
      }
      a.setup_ns = r.Get<uint64_t>("setup time");
      a.session = r.Get<uint32_t>("session token");
      if (a.session == 0) throw ProtocolError("session token 0");
      a.stage = r.Get<uint32_t>("stage");
      a.source_bytes = r.Get<uint64_t>("source bytes");
      r.ExpectEnd();
      return a;
    }
    case MessageType::kDone: {
      Done d;
      d.request_id = r.Get<uint32_t>("request id");
      r.Get<uint32_t>("padding");
      d.writes = r.Get<uint64_t>("writes");
      d.first_post_ns = r.Get<uint64_t>("first post");
      d.last_completion_ns = r.Get<uint64_t>("last completion");
      if (d.last_completion_ns < d.first_post_ns)
        throw ProtocolError("last completion before first post");
      r.ExpectEnd();
      return d;
    }
  }
  throw ProtocolError("unknown message type " + std::to_string(h.type));
}

std::optional<ForeignConnect> PeekForeignConnect(std::span<const uint8_t> bytes) {
  try {
    Reader r(bytes);
    const auto h = r.Get<Header>("header");
    if (h.magic != kMagic || h.version < kFirstStableVersion || h.version == kVersion ||
        static_cast<MessageType>(h.type) != MessageType::kConnect)
      return std::nullopt;
    ForeignConnect c{h.version, h.token, r.Get<uint32_t>("stage"), {}};
    const auto reply = r.Get<uint32_t>("reply address length");
    CheckAtMost(reply, kMaxAddressBytes, "reply address length");
    auto address = r.GetBytes(reply, "reply address");
    if (reply == 0) {  // the first lane's
      if (r.Get<uint32_t>("lane count") == 0) return std::nullopt;
      const auto n = r.Get<uint32_t>("address length");
      CheckAtMost(n, kMaxAddressBytes, "address length");
      address = r.GetBytes(n, "address");
    }
    if (address.empty()) return std::nullopt;
    c.reply.assign(address.begin(), address.end());
    return c;
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
}

static std::atomic<uint32_t> own_stage{0};
void SetOwnStage(uint32_t stage) {
  own_stage.store(stage);
}
uint32_t OwnStage() {
  return own_stage.load();
}
uint32_t StageOfProgram(const std::string& name) {
  if (name.size() < 3 || !std::isdigit(static_cast<unsigned char>(name[0])) ||
      !std::isdigit(static_cast<unsigned char>(name[1])) || name[2] != '_')
    return 0;
  return static_cast<uint32_t>((name[0] - '0') * 10 + (name[1] - '0'));
}
std::string StageName(uint32_t stage) {
  static const char* const kNames[] = {"01_send_recv",  "02_bidirectional", "03_gpudirect_write",
                                       "04_concurrent", "05_queuing",       "06_multi_nic",
                                       "07_full_p5"};
  if (stage >= 1 && stage <= std::size(kNames)) return kNames[stage - 1];
  return stage == 0 ? "a program of no stage" : "stage " + std::to_string(stage);
}

std::string Mismatch(const Message& answer) {
  uint32_t stage = OwnStage();
  if (auto* e = std::get_if<ErrorReply>(&answer)) {
    if (e->version != kVersion)
      return "the server speaks wire version " + std::to_string(e->version) + " and " +
             StageName(OwnStage()) + " version " + std::to_string(kVersion) +
             ": run a client and a server of one release (it said: " + e->text + ")";
    stage = e->stage;
  } else if (auto* a = std::get_if<Accept>(&answer)) {
    stage = a->stage;
  }
  if (stage == OwnStage()) return "";
  return "the server is " + StageName(stage) + " and this client " + StageName(OwnStage()) +
         ": a client is served by a server of its own stage";
}

uint32_t TokenOf(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(Header)) return 0;
  Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h.token;
}

std::optional<MessageType> TypeOf(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return static_cast<MessageType>(h.type);
}

uint32_t NewToken() {
  static thread_local std::mt19937 random{std::random_device{}()};
  uint32_t token = 0;
  while (token == 0) token = static_cast<uint32_t>(random());
  return token;
}

bool IsServerMessage(const Message& message) {
  return std::holds_alternative<Accept>(message) || std::holds_alternative<ErrorReply>(message) ||
         std::holds_alternative<Done>(message) || std::holds_alternative<Reply>(message);
}

const char* NameOf(const Message& message) {
  static const char* const kNames[] = {"CONNECT", "TRANSFER", "ERROR", "BYE",
                                       "ACCEPT",  "DONE",     "TEXT",  "REPLY"};
  return kNames[message.index()];
}

void ValidateTransfer(const Transfer& t, const RemoteRegion& region) {
  if (t.page_size == 0) throw ProtocolError("page size 0");
  CheckAtMost(t.page_size, kMaxPageBytes, "page size");
  if (t.pages.empty()) throw ProtocolError("page count 0");
  CheckAtMost<uint64_t>(t.pages.size(), kMaxPagesPerRequest, "page count");
  CheckAtMost<uint64_t>(t.page_size * t.pages.size(), kMaxRequestBytes, "request bytes");
  if (t.repeat == 0) throw ProtocolError("repeat 0");
  CheckAtMost(t.repeat, kMaxRepeat, "repeat");
  const uint64_t region_pages = region.length / t.page_size;
  for (size_t i = 0; i < t.pages.size(); ++i) {
    if (t.pages[i] >= region_pages)
      throw ProtocolError("page index " + std::to_string(t.pages[i]) + " (entry " +
                          std::to_string(i) + ") is outside the region of " +
                          std::to_string(region_pages) + " pages of " +
                          std::to_string(t.page_size) + " bytes");
  }
}

}  // namespace common::wire
