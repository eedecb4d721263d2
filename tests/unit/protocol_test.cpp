#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <set>

#include "protocol.hpp"

using namespace common;
using namespace common::wire;

namespace {

Connect SampleConnect() {
  Connect c;
  c.lanes.push_back({{1, 2, 3, 4}, {0x1000, 1 << 20, 0xabcdef}});
  c.lanes.push_back({std::vector<uint8_t>(32, 7), {0, 4096, 42}});
  c.engine = {kEnginePin | kEngineLazy, 2, 16, 512, 8, 0, 1 << 20};
  c.reply = {9, 9, 9};
  return c;
}

Transfer SampleTransfer() {
  Transfer t;
  t.request_id = 7;
  t.seed = 99;
  t.page_size = 65536;
  t.repeat = 3;
  t.pages = {5, 0, 12, 3};
  return t;
}

// Decodes and expects a ProtocolError whose text contains `what`.
void ExpectRejected(const std::vector<uint8_t>& bytes, const std::string& what) {
  try {
    Decode(bytes);
    FAIL() << "accepted; wanted: " << what;
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

template <typename T>
void Poke(std::vector<uint8_t>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// 02's TEXT and REPLY: the text travels whole, up to kMaxTextBytes; a REPLY is a server's.
TEST(Protocol, TextAndReplyRoundTrip) {
  auto text = std::get<Text>(Decode(Encode(Text{"Hello, RDMA!"}, 7)));
  EXPECT_EQ(text.text, "Hello, RDMA!");
  auto reply = std::get<Reply>(Decode(Encode(Reply{"!AMDR ,olleH"})));
  EXPECT_EQ(reply.text, "!AMDR ,olleH");
  EXPECT_TRUE(IsServerMessage(Reply{}));
  EXPECT_FALSE(IsServerMessage(Text{}));
  EXPECT_STREQ(NameOf(Text{}), "TEXT");
  EXPECT_THROW(Encode(Text{std::string(kMaxTextBytes + 1, 'x')}), ProtocolError);
  auto bad = Encode(Text{"abc"});
  bad[16] = 200;  // the text's length, past the bytes that came
  EXPECT_THROW(Decode(bad), ProtocolError);
}

// A lane without a region (02's CONNECT) is all zeros; length 0 with an address or key is not.
TEST(Protocol, ConnectWithoutARegion) {
  Connect c;
  c.lanes.push_back({{1, 2, 3}, {}});
  auto back = std::get<Connect>(Decode(Encode(c)));
  EXPECT_EQ(back.lanes[0].region.length, 0u);
  c.lanes[0].region.key = 5;
  EXPECT_THROW(Decode(Encode(c)), ProtocolError);
}

}  // namespace

TEST(Protocol, EveryMessageRoundTrips) {
  auto c = std::get<Connect>(Decode(Encode(SampleConnect())));
  ASSERT_EQ(c.lanes.size(), 2u);
  EXPECT_EQ(c.lanes[0].address, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.lanes[0].region.address, 0x1000u);
  EXPECT_EQ(c.lanes[0].region.length, 1u << 20);
  EXPECT_EQ(c.lanes[0].region.key, 0xabcdefu);
  EXPECT_EQ(c.lanes[1].address.size(), 32u);
  EXPECT_EQ(c.engine.flags, kEnginePin | kEngineLazy);
  EXPECT_EQ(c.engine.threads, 2u);
  EXPECT_EQ(c.engine.batch, 16u);
  EXPECT_EQ(c.engine.window, 512u);
  EXPECT_EQ(c.engine.doorbell, 8u);
  EXPECT_EQ(c.engine.memory, 1u << 20);
  EXPECT_EQ(c.reply, (std::vector<uint8_t>{9, 9, 9}));

  auto t = std::get<Transfer>(Decode(Encode(SampleTransfer())));
  EXPECT_EQ(t.request_id, 7u);
  EXPECT_EQ(t.seed, 99u);
  EXPECT_EQ(t.page_size, 65536u);
  EXPECT_EQ(t.repeat, 3u);
  EXPECT_EQ(t.pages, (std::vector<uint32_t>{5, 0, 12, 3}));

  auto e = std::get<ErrorReply>(Decode(Encode(ErrorReply{3, "no"})));
  EXPECT_EQ(e.request_id, 3u);
  EXPECT_EQ(e.text, "no");
  EXPECT_TRUE(std::holds_alternative<Bye>(Decode(Encode(Bye{}))));
  EXPECT_TRUE(std::get<Accept>(Decode(Encode(Accept{{}, 0, 5}))).writers.empty());
  auto a = std::get<Accept>(Decode(Encode(Accept{{{1, 2}, {3, 4, 5}}, 1234, 77, 7, 1ull << 30})));
  EXPECT_EQ(a.writers, (std::vector<std::vector<uint8_t>>{{1, 2}, {3, 4, 5}}));
  EXPECT_EQ(a.setup_ns, 1234u);
  EXPECT_EQ(a.session, 77u);
  EXPECT_EQ(a.source_bytes, 1ull << 30);
  auto d = std::get<Done>(Decode(Encode(Done{7, 100, 1000, 5000})));
  EXPECT_EQ(d.request_id, 7u);
  EXPECT_EQ(d.writes, 100u);
  EXPECT_EQ(d.first_post_ns, 1000u);
  EXPECT_EQ(d.last_completion_ns, 5000u);
}

TEST(Protocol, AcceptAndDoneFieldsAreChecked) {
  ExpectRejected(Encode(Done{1, 1, 5000, 1000}), "last completion before first post");
  auto bad = Encode(Accept{{{1, 2}}, 0, 1});
  Poke<uint32_t>(bad, 16, kMaxLanes + 1);
  ExpectRejected(bad, "writer count 65 is over the limit 64");
  bad = Encode(Accept{{{1, 2}}, 0, 1});
  Poke<uint32_t>(bad, 20, 0);
  ExpectRejected(bad, "address length 0");
  ExpectRejected(Encode(Accept{{{1, 2}}, 0, 0}), "session token 0");
}

// The header's token travels as it was given, on every type, and is read back beside the
// message; a message sent without one carries 0.
TEST(Protocol, TokenTravelsInTheHeader) {
  const std::vector<Message> all = {SampleTransfer(), ErrorReply{1, "x"}, Bye{}, Accept{{}, 0, 9},
                                    Done{1, 1, 1, 2}};
  for (const auto& m : all) {
    uint32_t token = 1;
    Decode(Encode(m, 0xabcd1234u), &token);
    EXPECT_EQ(token, 0xabcd1234u);
    Decode(Encode(m), &token);
    EXPECT_EQ(token, 0u);
  }
}

// A message's type and token are read from its header alone (03 looks for a BYE waiting in its
// inbox without decoding it).
TEST(Protocol, TypeAndTokenOfAHeaderAlone) {
  const std::vector<uint8_t> bye = Encode(Bye{}, 7);
  EXPECT_EQ(TypeOf(bye), MessageType::kBye);
  EXPECT_EQ(TokenOf(bye), 7u);
  EXPECT_EQ(TypeOf(Encode(SampleTransfer())), MessageType::kTransfer);
  EXPECT_EQ(TypeOf(std::span(bye).first(sizeof(Header) - 1)), std::nullopt);
  EXPECT_EQ(TokenOf(std::span(bye).first(sizeof(Header) - 1)), 0u);
}

TEST(Protocol, NewTokensAreNeverZeroAndDiffer) {
  std::set<uint32_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t t = NewToken();
    EXPECT_NE(t, 0u);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 990u);  // 1000 draws of 32 bits: a repeat is already rare
}

TEST(Protocol, OnlyAcceptErrorAndDoneAreServerMessages) {
  EXPECT_TRUE(IsServerMessage(Accept{}));
  EXPECT_TRUE(IsServerMessage(ErrorReply{}));
  EXPECT_TRUE(IsServerMessage(Done{}));
  EXPECT_FALSE(IsServerMessage(Connect{}));
  EXPECT_FALSE(IsServerMessage(SampleTransfer()));
  EXPECT_FALSE(IsServerMessage(Bye{}));
}

TEST(Protocol, HeaderFieldsAreChecked) {
  const auto good = Encode(SampleTransfer());
  ExpectRejected({good.begin(), good.begin() + 8}, "message ends inside field 'header'");
  auto bad = good;
  Poke<uint32_t>(bad, 0, 0x12345678);
  ExpectRejected(bad, "wrong magic");
  bad = good;
  Poke<uint16_t>(bad, 4, 1);
  ExpectRejected(bad, "wire version 1 (this program speaks " + std::to_string(kVersion) + ")");
  bad = good;
  Poke<uint16_t>(bad, 6, 99);
  ExpectRejected(bad, "unknown message type 99");
  bad = good;
  Poke<uint32_t>(bad, 8, static_cast<uint32_t>(good.size() + 4));
  ExpectRejected(bad, "header says");
  bad = good;
  bad.push_back(0);  // more bytes arrived than the header says
  ExpectRejected(bad, "header says");
}

TEST(Protocol, ConnectFieldsAreChecked) {
  // Header, stage, reply address (length, bytes), lane count, then each lane: address length,
  // address, region (address, length, key); the engine settings last.
  const auto good = Encode(SampleConnect());
  const size_t lanes = sizeof(Header) + 4 + 4 + SampleConnect().reply.size();
  const size_t first = lanes + 4, region = first + 4 + 4;
  auto bad = good;
  Poke<uint32_t>(bad, sizeof(Header) + 4, kMaxAddressBytes + 1);
  ExpectRejected(bad, "reply address length 257 is over the limit 256");
  bad = good;
  Poke<uint32_t>(bad, lanes, 0);
  ExpectRejected(bad, "lane count 0");
  bad = good;
  Poke<uint32_t>(bad, lanes, kMaxLanes + 1);
  ExpectRejected(bad, "lane count 65 is over the limit 64");
  bad = good;
  Poke<uint32_t>(bad, first, 0);  // first lane's address length
  ExpectRejected(bad, "address length 0");
  bad = good;
  Poke<uint32_t>(bad, first, kMaxAddressBytes + 1);
  ExpectRejected(bad, "address length 257 is over the limit 256");
  bad = good;
  Poke<uint64_t>(bad, region + 8, 0);  // first region's length
  ExpectRejected(bad, "region length 0");
  bad = good;
  Poke<uint64_t>(bad, region + 8, kMaxRegionBytes + 1);
  ExpectRejected(bad, "region length");
  bad = good;
  Poke<uint64_t>(bad, region, UINT64_MAX - 10);  // address + length wraps around
  ExpectRejected(bad, "overflows");
  bad = good;
  bad.resize(bad.size() - 1);
  Poke<uint32_t>(bad, 8, static_cast<uint32_t>(bad.size()));
  ExpectRejected(bad, "message ends inside field");
  // flags, threads, batch, window, doorbell, reserved, memory
  const size_t engine = good.size() - sizeof(Engine);
  bad = good;
  Poke<uint32_t>(bad, engine, 1u << 9);
  ExpectRejected(bad, "unknown engine flags 512");
  bad = good;
  Poke<uint32_t>(bad, engine + 4, kMaxLanes + 1);
  ExpectRejected(bad, "engine threads 65 is over the limit 64");
  bad = good;
  Poke<uint32_t>(bad, engine + 8, 0);
  ExpectRejected(bad, "engine batch 0");
  bad = good;
  Poke<uint32_t>(bad, engine + 12, kMaxWindow + 1);
  ExpectRejected(bad, "engine window");
  bad = good;
  Poke<uint32_t>(bad, engine + 16, 0);
  ExpectRejected(bad, "engine doorbell 0");
  bad = good;
  Poke<uint64_t>(bad, engine + 24, kMaxRegionBytes + 1);
  ExpectRejected(bad, "engine memory");
}

// The stage travels in CONNECT, ACCEPT and ERROR; a program's own is its name's number.
TEST(Protocol, MessagesSayTheirStage) {
  EXPECT_EQ(StageOfProgram("05_queuing"), 5u);
  EXPECT_EQ(StageOfProgram("07_full_p5"), 7u);
  EXPECT_EQ(StageOfProgram("hostile_peer"), 0u);
  EXPECT_EQ(StageOfProgram("5_x"), 0u);
  EXPECT_EQ(StageName(3), "03_gpudirect_write");
  EXPECT_EQ(StageName(9), "stage 9");
  const uint32_t own = OwnStage();
  SetOwnStage(5);
  Connect c = SampleConnect();
  EXPECT_EQ(c.stage, 5u);
  c.stage = 7;
  EXPECT_EQ(std::get<Connect>(Decode(Encode(c))).stage, 7u);
  EXPECT_EQ(std::get<Accept>(Decode(Encode(Accept{{}, 0, 1}))).stage, 5u);
  ErrorReply e{0, "no"};
  e.stage = 2;
  EXPECT_EQ(std::get<ErrorReply>(Decode(Encode(e))).stage, 2u);
  SetOwnStage(own);
}

// A client reads its server's answer for what it says of the server: of its own stage and
// version, nothing to say; else one line naming both.
TEST(Protocol, AMismatchedServerIsNamed) {
  const uint32_t own = OwnStage();
  SetOwnStage(7);
  EXPECT_EQ(Mismatch(Accept{{}, 0, 1}), "");
  EXPECT_EQ(Mismatch(ErrorReply{1, "server full"}), "");
  EXPECT_EQ(Mismatch(Done{}), "");
  Accept a{{}, 0, 1};
  a.stage = 5;
  EXPECT_EQ(Mismatch(a),
            "the server is 05_queuing and this client 07_full_p5: a client is served by a server "
            "of its own stage");
  ErrorReply e{0, "05_queuing serves clients of its own stage"};
  e.stage = 5;
  EXPECT_NE(Mismatch(e).find("the server is 05_queuing and this client 07_full_p5"),
            std::string::npos);
  SetOwnStage(own);
}

// From kFirstStableVersion on, an ERROR reads the same in every version, and a CONNECT's first
// fields too: a server of another version answers by name, and its client reads why.
TEST(Protocol, AnotherVersionIsReadWhereItKeepsItsPlace) {
  const uint32_t own = OwnStage();
  SetOwnStage(7);
  const std::string next = std::to_string(kVersion + 1), own_version = std::to_string(kVersion);
  auto error = Encode(ErrorReply{0, "07_full_p5 speaks wire version " + next}, 9);
  Poke<uint16_t>(error, offsetof(Header, version), kVersion + 1);
  uint32_t token = 0;
  auto e = std::get<ErrorReply>(Decode(error, &token));
  EXPECT_EQ(token, 9u);
  EXPECT_EQ(e.version, kVersion + 1);
  EXPECT_EQ(Mismatch(e),
            "the server speaks wire version " + next + " and 07_full_p5 version " + own_version +
                ": run a client and a server of one release (it said: 07_full_p5 speaks wire "
                "version " +
                next + ")");
  auto accept = Encode(Accept{{}, 0, 1});
  Poke<uint16_t>(accept, offsetof(Header, version), kVersion + 1);
  ExpectRejected(accept, "wire version " + next + " (this program speaks " + own_version +
                             ")");  // only ERROR is stable

  Connect c = SampleConnect();
  auto connect = Encode(c, 77);
  EXPECT_EQ(PeekForeignConnect(connect), std::nullopt);  // our own version: Decode reads it
  Poke<uint16_t>(connect, offsetof(Header, version), kVersion + 1);
  auto foreign = PeekForeignConnect(connect);
  ASSERT_TRUE(foreign.has_value());
  EXPECT_EQ(foreign->version, kVersion + 1);
  EXPECT_EQ(foreign->token, 77u);
  EXPECT_EQ(foreign->stage, 7u);
  EXPECT_EQ(foreign->reply, c.reply);
  c.reply.clear();  // 03-06: the first lane's address is where answers go
  connect = Encode(c);
  Poke<uint16_t>(connect, offsetof(Header, version), kVersion + 1);
  EXPECT_EQ(PeekForeignConnect(connect)->reply, c.lanes[0].address);
  Poke<uint16_t>(connect, offsetof(Header, version), 2);  // before the stable layout
  EXPECT_EQ(PeekForeignConnect(connect), std::nullopt);
  SetOwnStage(own);
}

TEST(Protocol, TransferFieldsAreChecked) {
  const auto good = Encode(SampleTransfer());
  auto bad = good;
  Poke<uint32_t>(bad, 20, 0);  // page count
  ExpectRejected(bad, "page count 0");
  bad = good;
  Poke<uint32_t>(bad, 20, kMaxPagesPerRequest + 1);
  ExpectRejected(bad, "page count 8193 is over the limit 8192");
  bad = good;
  Poke<uint32_t>(bad, 20, 5);  // says 5 pages, 4 follow
  ExpectRejected(bad, "message ends inside field 'page index'");
}

TEST(Protocol, TransferIsValidatedAgainstTheRegionAndLimits) {
  const RemoteRegion region{0, 16 * 65536, 1};
  EXPECT_NO_THROW(ValidateTransfer(SampleTransfer(), region));
  auto t = SampleTransfer();
  t.pages.back() = 16;
  try {
    ValidateTransfer(t, region);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_STREQ(e.what(),
                 "page index 16 (entry 3) is outside the region of 16 pages of 65536 bytes");
  }
  t = SampleTransfer();
  t.page_size = 0;
  EXPECT_THROW(ValidateTransfer(t, region), ProtocolError);
  t.page_size = kMaxPageBytes + 1;
  EXPECT_THROW(ValidateTransfer(t, region), ProtocolError);
  t = SampleTransfer();
  t.repeat = 0;
  EXPECT_THROW(ValidateTransfer(t, region), ProtocolError);
  t.repeat = kMaxRepeat + 1;
  EXPECT_THROW(ValidateTransfer(t, region), ProtocolError);
  t = SampleTransfer();
  t.pages.clear();
  EXPECT_THROW(ValidateTransfer(t, region), ProtocolError);
  t = SampleTransfer();
  t.page_size = kMaxPageBytes;
  t.pages.assign(17, 0);  // 17 x 64 MiB > the 1 GiB a request may hold
  EXPECT_THROW(ValidateTransfer(t, {0, kMaxRegionBytes, 1}), ProtocolError);
}

TEST(Protocol, EncodeRefusesOversizedMessages) {
  Transfer t = SampleTransfer();
  t.pages.assign(kMaxMessageBytes / 4, 0);
  EXPECT_THROW(Encode(t), ProtocolError);
  // An error text is cut to fit rather than refused.
  EXPECT_LE(Encode(ErrorReply{1, std::string(100000, 'x')}).size(), kMaxMessageBytes);
}
