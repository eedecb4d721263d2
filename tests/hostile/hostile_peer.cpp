// hostile_peer: a misbehaving client, for the tests. It speaks the wire protocol of stages 03
// on with libfabric directly and does, on purpose, what a careless or malicious process on
// the network could: oversized and malformed messages, CONNECTs that name addresses where
// nothing listens or another client's lanes, floods of clients, huge or endless requests, a
// page outside the region, leaving mid-request, never reading its completions, writing into
// another client's region with guessed keys, dying right after a CONNECT.
//
//   hostile_peer [-p PROVIDER] [--domain D] ADDRESS CASE [--stage N] [--count N] [--victim FILE]
//                [--lane K]
//
// Every loop it runs is bounded (--seconds, default 10). It prints one line per thing it did
// ("sent ...", "refused: ...", "wrote N of M") and exits 0 when it could do its part, 1 when
// it could not (which the tests read as the attack not even starting), 2 on bad usage.
#include <CLI/CLI.hpp>

#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <cstddef>

#include <signal.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "address.hpp"
#include "completion.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "mailbox.hpp"
#include "options.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "provider.hpp"

using namespace common;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBig = 1 << 20;  // an oversized message: 16 times the receive buffers

struct Peer {
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  HostBuffer buffer{2 * kBig};
  MrPtr mr;
  fi_addr_t server = FI_ADDR_UNSPEC;
  HostBuffer region;  // where the server's WRITEs land, when it advertises a real one
  MrPtr region_mr;
  wire::RemoteRegion advertised{};
  std::vector<fi_context2> contexts = std::vector<fi_context2>(64);
  size_t posted = 0, sends = 0, errors = 0, received = 0;
  std::string last_error, last_text;
  // The tokens of docs/wire-protocol.md: its CONNECT's own, and the session's from ACCEPT,
  // which its later messages carry, as a client's do (a misbehaving client, not a stranger).
  uint32_t nonce = wire::NewToken(), session = 0;

  std::vector<uint8_t> Address() const {
    size_t length = 256;
    std::vector<uint8_t> a(length);
    FI_CHECK(fi_getname(&ep->fid, a.data(), &length));
    a.resize(length);
    return a;
  }
};

std::unique_ptr<Peer> Open(const Options& options, std::span<const uint8_t> server, bool receive) {
  auto p = std::make_unique<Peer>();
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_SOURCE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  p->info = SelectProvider(*hints, options, server);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(p->info->fabric_attr, &fabric, nullptr));
  p->fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(p->fabric.get(), p->info.get(), &domain, nullptr));
  p->domain.reset(domain);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  fid_cq* cq = nullptr;
  FI_CHECK(fi_cq_open(p->domain.get(), &cq_attr, &cq, nullptr));
  p->cq.reset(cq);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  FI_CHECK(fi_av_open(p->domain.get(), &av_attr, &av, nullptr));
  p->av.reset(av);
  fid_ep* ep = nullptr;
  FI_CHECK(fi_endpoint(p->domain.get(), p->info.get(), &ep, nullptr));
  p->ep.reset(ep);
  FI_CHECK(fi_ep_bind(p->ep.get(), &p->cq->fid, FI_TRANSMIT | FI_RECV));
  FI_CHECK(fi_ep_bind(p->ep.get(), &p->av->fid, 0));
  FI_CHECK(fi_enable(p->ep.get()));
  fid_mr* mr = nullptr;
  FI_CHECK(fi_mr_reg(p->domain.get(), p->buffer.data(), p->buffer.size(),
                     FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0, 1, 0, &mr, nullptr));
  p->mr.reset(mr);
  if (fi_av_insert(p->av.get(), server.data(), 1, &p->server, 0, nullptr) != 1)
    throw Error("fi_av_insert: the server's address was not accepted");
  if (receive)  // a receive for the server's answers (ACCEPT, ERROR), in the second half
    FI_CHECK(fi_recv(p->ep.get(), p->buffer.data() + kBig, wire::kMaxMessageBytes,
                     fi_mr_desc(p->mr.get()), FI_ADDR_UNSPEC, &p->contexts[0]));
  return p;
}

void Poll(Peer& p) {
  ReadCompletions(
      p.cq.get(), true,
      [&](const fi_cq_data_entry& e, fi_addr_t) {
        if (e.op_context == &p.contexts[0]) {
          ++p.received;
          try {
            auto m = wire::Decode({p.buffer.data() + kBig, e.len});
            // "wait: " and "as is: " answer nothing yet (07 rebuilds its engine first, or
            // serves it with the engine as it is): its ACCEPT or ERROR is the answer.
            if (auto* err = std::get_if<wire::ErrorReply>(&m);
                err &&
                (err->text.rfind(wire::kWait, 0) == 0 || err->text.rfind(wire::kAsIs, 0) == 0))
              --p.received;
            else if (err)
              p.last_text = err->text;
            if (auto* a = std::get_if<wire::Accept>(&m)) {
              p.last_text = "ACCEPT";
              p.session = a->session;
            }
          } catch (const Error&) {
          }
          fi_recv(p.ep.get(), p.buffer.data() + kBig, wire::kMaxMessageBytes,
                  fi_mr_desc(p.mr.get()), FI_ADDR_UNSPEC, &p.contexts[0]);
        } else {
          ++p.sends;
        }
      },
      [&](const CompletionError& e) {
        ++p.errors;
        p.last_error = e.text;
      });
}

// Getting in is not the attack: on a busy host rxm's tcp connection alone can take longer
// than the attack's --seconds, and the provider pushes back until it is up. Setting up (the
// CONNECT and its answer, the first SEND) gets at least 30 s.
Clock::time_point SetupDeadline(Clock::time_point deadline) {
  return std::max(deadline, Clock::now() + std::chrono::seconds(30));
}

// Posts one SEND of `bytes` (copied into the first half of the buffer), retrying while the
// provider pushes back, until `deadline` (for a peer's first SEND, the setup deadline). True
// when it was posted; it is tried at least once.
bool Send(Peer& p, std::span<const uint8_t> bytes, Clock::time_point deadline) {
  // A slot of its own for each message in flight (16 of 64 KiB), or an oversized one alone:
  // a provider may still read an earlier message from its buffer.
  static size_t next = 0;
  const size_t slot = bytes.size() > wire::kMaxMessageBytes ? 0 : (next++ % 16);
  uint8_t* at = p.buffer.data() + slot * wire::kMaxMessageBytes;
  std::memcpy(at, bytes.data(), bytes.size());
  if (p.posted == 0) deadline = SetupDeadline(deadline);
  do {
    ssize_t rc = fi_send(p.ep.get(), at, bytes.size(), fi_mr_desc(p.mr.get()), p.server,
                         &p.contexts[1 + p.posted % 60]);
    if (rc == 0) {
      ++p.posted;
      return true;
    }
    if (rc != -FI_EAGAIN) {
      p.last_error = fi_strerror(static_cast<int>(-rc));
      return false;
    }
    Poll(p);
  } while (Clock::now() < deadline);
  p.last_error = "the provider pushed back (-FI_EAGAIN) until the deadline";
  return false;
}

bool SendMessage(Peer& p, const wire::Message& m, Clock::time_point deadline) {
  return Send(p, wire::Encode(m, std::holds_alternative<wire::Connect>(m) ? p.nonce : p.session),
              deadline);
}

// The same bytes with the session's token in their header, where they have one.
std::vector<uint8_t> Stamped(const Peer& p, std::vector<uint8_t> bytes) {
  if (bytes.size() >= sizeof(wire::Header)) std::memcpy(bytes.data() + 12, &p.session, 4);
  return bytes;
}

// Polls until `done()` or the deadline.
template <typename Done>
bool WaitFor(Peer& p, Done done, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    Poll(p);
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// Waits for the server's answer to `c`, sending it again as a client does (the server answers
// a CONNECT once one came from the address it names); true once one more message than
// `before` has come.
bool AwaitAnswer(Peer& p, const wire::Connect& c, size_t before, Clock::time_point deadline) {
  common::ConnectRepeat again;
  while (Clock::now() < deadline) {
    Poll(p);
    if (p.received > before) return true;
    if (again.Due() && !SendMessage(p, c, deadline)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// Connects (see SetupDeadline); the time it took is added to `deadline`, so that the attack
// after it still has its --seconds.
bool Connect(Peer& p, const wire::Connect& c, Clock::time_point& deadline) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point setup = SetupDeadline(deadline);
  const size_t before = p.received;
  const bool in = SendMessage(p, c, setup) && AwaitAnswer(p, c, before, setup);
  deadline += Clock::now() - start;
  return in;
}

// A CONNECT for `p`: its own address on one lane, a region it advertises (of `region` bytes
// at address 0 with key 1; nothing is registered there: the server must never write).
// Registers `bytes` of memory for the server's WRITEs and advertises it, as a client does.
void RegisterRegion(Peer& p, size_t bytes) {
  p.region = HostBuffer(bytes);
  fid_mr* mr = nullptr;
  FI_CHECK(
      fi_mr_reg(p.domain.get(), p.region.data(), bytes, FI_REMOTE_WRITE, 0, 77, 0, &mr, nullptr));
  p.region_mr.reset(mr);
  const bool virt = p.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  p.advertised = {virt ? reinterpret_cast<uint64_t>(p.region.data()) : 0, bytes,
                  fi_mr_key(p.region_mr.get())};
}

// `memory`: the source memory per lane it asks 07's server to hold for it. Without a region
// of its own registered, it advertises `region` bytes at address 0 with key 1, where nothing
// of its is: the server's WRITEs there fail.
wire::Connect ConnectOf(const Peer& p, uint64_t region, std::vector<uint8_t> address = {},
                        uint64_t memory = 1 << 20) {
  wire::Connect c;
  const wire::RemoteRegion where = p.region_mr ? p.advertised : wire::RemoteRegion{0, region, 1};
  c.lanes.push_back({address.empty() ? p.Address() : address, where});
  c.engine = {wire::kEngineFlags, 1, 1, 64, 1, 0, memory};
  return c;
}

wire::Transfer TransferOf(uint32_t id, uint32_t pages, uint64_t page_size, uint64_t repeat) {
  wire::Transfer t;
  t.request_id = id;
  t.seed = 7;
  t.page_size = page_size;
  t.repeat = repeat;
  for (uint32_t i = 0; i < pages; ++i) t.pages.push_back(i);
  return t;
}

// The malformed messages: each breaks one rule of the protocol (docs/wire-protocol.md).
std::vector<std::pair<std::string, std::vector<uint8_t>>> Malformed(const Peer& p) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> all;
  auto with = [&](const std::string& name, std::vector<uint8_t> bytes, size_t at, auto value) {
    std::memcpy(bytes.data() + at, &value, sizeof(value));
    all.emplace_back(name, std::move(bytes));
  };
  const auto connect = wire::Encode(ConnectOf(p, 1 << 20));
  const auto transfer = wire::Encode(TransferOf(1, 4, 4096, 1));
  const auto bye = wire::Encode(wire::Bye{});
  all.emplace_back("empty", std::vector<uint8_t>{});
  all.emplace_back("one byte", std::vector<uint8_t>{1});
  all.emplace_back("header cut short", std::vector<uint8_t>(connect.begin(), connect.begin() + 10));
  with("wrong magic", connect, 0, uint32_t{0xdeadbeef});
  with("wrong version", connect, 4, uint16_t{99});
  with("unknown type", bye, 6, uint16_t{77});
  with("length too long", connect, 8, uint32_t{100000});
  with("length too short", connect, 8, uint32_t{16});
  // A CONNECT: header, stage (16), reply address length (20; 0 here), lane count (24), first
  // lane's address length (28).
  with("another stage", connect, 16, uint32_t{99});
  with("huge reply address length", connect, 20, uint32_t{1u << 30});
  with("zero lanes", connect, 24, uint32_t{0});
  with("too many lanes", connect, 24, uint32_t{1000});
  with("zero address length", connect, 28, uint32_t{0});
  with("huge address length", connect, 28, uint32_t{1u << 30});
  all.emplace_back("connect cut short", std::vector<uint8_t>(connect.begin(), connect.end() - 8));
  {
    auto b = connect;
    b.push_back(0);
    uint32_t n = static_cast<uint32_t>(b.size());
    std::memcpy(b.data() + 8, &n, 4);
    all.emplace_back("trailing byte", b);
  }
  with("zero page count", transfer, 20, uint32_t{0});
  with("too many pages", transfer, 20, uint32_t{1u << 30});
  with("page size zero", transfer, 32, uint64_t{0});
  with("page size huge", transfer, 32, uint64_t{1ull << 40});
  with("repeat zero", transfer, 40, uint64_t{0});
  with("repeat huge", transfer, 40, uint64_t{1ull << 60});
  with("page outside region", transfer, 48, uint32_t{0xffffffff});
  all.emplace_back("transfer cut short",
                   std::vector<uint8_t>(transfer.begin(), transfer.end() - 3));
  all.emplace_back("accept from a client", wire::Encode(wire::Accept{}));
  all.emplace_back("error from a client", wire::Encode(wire::ErrorReply{1, "boo"}));
  return all;
}

// Leaves as a misbehaving peer does: at once, closing nothing (its endpoints may have
// operations in flight, which some providers do not close cleanly).
[[noreturn]] void Leave(int rc) {
  std::fflush(stdout);
  RemoveShmRegionsOf(getpid());
  _exit(rc);
}

// Another way of writing the same address, which the provider takes for the same peer.
std::vector<uint8_t> Respell(std::vector<uint8_t> address, const std::string& how,
                             const fi_info& info) {
  if (how == "same") return address;
  const bool text = info.addr_format == FI_ADDR_STR;
  std::string name = text ? std::string(reinterpret_cast<const char*>(address.data())) : "";
  const std::string bare =
      name.substr(name.find("://") == std::string::npos ? 0 : name.find("://") + 3);
  auto bytes = [](const std::string& s) {
    std::vector<uint8_t> b(s.begin(), s.end());
    b.push_back(0);
    return b;
  };
  if (text && how == "bare") return bytes(bare);
  if (text && how == "scheme") return bytes("fi_ns://" + bare);
  if (text && how == "tail") {
    address.insert(address.end(), {'x', 0});
    return address;
  }
  if (!text && how == "tail" && address.size() == sizeof(sockaddr_in)) {
    std::fill(address.begin() + offsetof(sockaddr_in, sin_zero), address.end(), 0x5a);
    return address;
  }
  throw UsageError("--spelling " + how + " does not apply to " + info.fabric_attr->prov_name +
                   " addresses");
}

// What every case is given: the command line and the server under attack. Each case is a
// method; it ends the process (Leave) once it has done its part.
struct Attack {
  Options options;
  std::string what;
  uint64_t count = 1;
  double seconds = 10;
  double hold = 2;
  std::string victim;
  std::string spelling = "same";
  size_t lane = 0;  // claim-lane: which of the victim's lanes
  std::vector<uint8_t> server;
  Clock::time_point deadline;
  bool tcp = false;

  [[noreturn]] void Oversize();
  [[noreturn]] void ConnectNowhere();
  [[noreturn]] void ConnectReflect();
  [[noreturn]] void ConnectSelf();
  [[noreturn]] void ByeThenBig();
  [[noreturn]] void TransferDie();
  [[noreturn]] void ConnectVersion();
  [[noreturn]] void ConnectDie();
  [[noreturn]] void StrangerBye();
  [[noreturn]] void ForgeClient();
  [[noreturn]] void Deaf();
  [[noreturn]] void Flood();
  [[noreturn]] void Requests();
  [[noreturn]] void MalformedMessages();
  [[noreturn]] void ClaimLane();
  [[noreturn]] void StrangerWrite();
};

}  // namespace

// one SEND far over the receive buffers, before any CONNECT
void Attack::Oversize() {
  auto p = Open(options, server, false);
  std::vector<uint8_t> big(kBig, 0x5a);
  if (!Send(*p, big, deadline)) throw Error("could not post: " + p->last_error);
  WaitFor(
      *p, [&] { return p->sends + p->errors > 0; }, deadline);
  std::printf("sent %zu bytes: %s\n", big.size(),
              p->errors  ? p->last_error.c_str()
              : p->sends ? "completed"
                         : "no completion");
  Leave(0);
}
void Attack::ConnectNowhere() {
  // A CONNECT whose lane 0 names an address where nothing listens: the server's answer
  // can never be delivered.
  auto p = Open(options, server, true);
  std::vector<uint8_t> address;
  if (what == "connect-fake-shm") {
    const std::string name = "fi_shm://fake0";
    address.assign(name.begin(), name.end());
    address.push_back(0);
  } else if (tcp) {
    address = p->Address();   // a sockaddr_in: keep the family, point it at port 40000 of
    address[2] = 40000 >> 8;  // this host, where nothing listens
    address[3] = 40000 & 0xff;
  } else {
    const std::string name = "fi_shm://" + std::to_string(getpid()) + ":nobody";
    address.assign(name.begin(), name.end());
    address.push_back(0);
  }
  // Each CONNECT names an address of its own (the next port; "-N" after the shm name),
  // so that the server's AV takes a new entry for each (over shm, a name without a file in
  // /dev/shm: the server refuses it before its AV).
  std::vector<uint8_t> first = address;
  const Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    std::vector<uint8_t> named = address;
    if (what == "connect-nowhere" && tcp) {
      const unsigned port = 40000 + static_cast<unsigned>(i % 20000);
      named[2] = static_cast<uint8_t>(port >> 8);
      named[3] = static_cast<uint8_t>(port & 0xff);
    } else if (what == "connect-nowhere" && i > 0) {
      named.pop_back();
      for (char c : "-" + std::to_string(i)) named.push_back(static_cast<uint8_t>(c));
      named.push_back(0);
    }
    if (!SendMessage(*p, ConnectOf(*p, 1 << 20, named), deadline))
      throw Error("could not send CONNECT: " + p->last_error);
    if (i == 0) deadline += Clock::now() - start;  // getting in is not the attack
  }
  WaitFor(
      *p, [&] { return p->sends >= count; }, deadline);
  std::printf("sent %llu CONNECTs naming %s%s\n", static_cast<unsigned long long>(count),
              ToHex(first).c_str(), count > 1 ? " and the next ones" : "");
  Leave(0);
}
void Attack::ConnectReflect() {
  // CONNECTs that name other endpoints of ours, victims that never spoke to the server,
  // sent as a client sends its own (again and again for --seconds, as if unanswered).
  // A server that answered them would make anyone its sender of messages to anyone. The
  // victims (--count of them, each named by CONNECTs of its own) listen all along and
  // count what reaches them.
  auto p = Open(options, server, true);
  std::vector<std::unique_ptr<Peer>> victims;
  for (uint64_t i = 0; i < count; ++i) victims.push_back(Open(options, server, true));
  const Clock::time_point until =  // --seconds from here: opening them takes a while
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<wire::Connect> connects;
  for (auto& v : victims) connects.push_back(ConnectOf(*p, 1 << 20, v->Address()));
  common::ConnectRepeat again;
  uint64_t sent = 0;
  for (bool first = true; Clock::now() < until; first = false) {
    if (first || again.Due())
      for (const auto& c : connects) sent += SendMessage(*p, c, until);
    Poll(*p);
    for (auto& v : victims) Poll(*v);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  size_t reached = 0;
  for (auto& v : victims) reached += v->received;
  std::printf(
      "connect-reflect: sent %llu CONNECTs naming %zu other endpoints; they received "
      "%zu messages, the sender %zu\n",
      static_cast<unsigned long long>(sent), victims.size(), reached, p->received);
  Leave(0);
}
void Attack::ConnectSelf() {
  // A CONNECT whose every address is the server's own: answering it, the server would
  // talk to itself, and answering those answers, for ever.
  auto p = Open(options, server, true);
  wire::Connect c = ConnectOf(*p, 1 << 20, server);
  c.reply = server;
  const Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    if (!SendMessage(*p, c, deadline)) throw Error("could not send CONNECT: " + p->last_error);
    if (i == 0) deadline += Clock::now() - start;  // getting in is not the attack
  }
  WaitFor(
      *p, [&] { return p->sends >= count; }, deadline);
  std::printf("sent %llu CONNECTs naming the server's own address\n",
              static_cast<unsigned long long>(count));
  Leave(0);
}
void Attack::ByeThenBig() {
  // Connects, says BYE, waits until the server has forgotten it (--hold seconds), then
  // sends a TRANSFER longer than shm's inline messages (2000 pages: 8 KiB) from the same
  // endpoint: the server's AV no longer knows it (libfabric 1.17's shm once crashed there).
  auto p = Open(options, server, true);
  if (!Connect(*p, ConnectOf(*p, 64 << 20), deadline))
    throw Error("no answer to CONNECT from the server");
  if (!SendMessage(*p, wire::Bye{}, deadline)) throw Error(p->last_error);
  WaitFor(
      *p, [&] { return false; },
      Clock::now() +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(hold)));
  uint64_t sent = 0;
  for (uint64_t i = 0; i < count; ++i)
    sent += SendMessage(*p, TransferOf(1, 2000, 4096, 1), deadline);
  WaitFor(
      *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(500));
  std::printf("bye-then-big: sent %llu TRANSFERs of 2000 pages after BYE\n",
              static_cast<unsigned long long>(sent));
  Leave(0);
}
void Attack::TransferDie() {
  // Connects, sends a TRANSFER longer than shm's inline size and dies at once, before the
  // server has read it: shm then copies it from a process that is gone.
  auto p = Open(options, server, true);
  RegisterRegion(*p, 64 << 20);
  if (!Connect(*p, ConnectOf(*p, 64 << 20), deadline))
    throw Error("no answer to CONNECT from the server");
  for (uint64_t i = 0; i < count; ++i)
    SendMessage(*p, TransferOf(static_cast<uint32_t>(i + 1), 2000, 4096, 1), deadline);
  std::printf("transfer-die: sent %llu TRANSFERs of 2000 pages, dying\n",
              static_cast<unsigned long long>(count));
  std::fflush(stdout);
  kill(getpid(), SIGKILL);
  Leave(1);  // not reached
}
void Attack::ConnectVersion() {
  // A CONNECT of the next wire version, as a client of a later release sends: the server
  // refuses it by name, from the fields every version keeps in place.
  auto p = Open(options, server, true);
  std::vector<uint8_t> bytes = wire::Encode(ConnectOf(*p, 1 << 20), p->nonce);
  const uint16_t next = wire::kVersion + 1;
  std::memcpy(bytes.data() + offsetof(wire::Header, version), &next, sizeof(next));
  const Clock::time_point setup = SetupDeadline(deadline);
  common::ConnectRepeat again;
  while (p->received == 0 && Clock::now() < setup) {
    if (again.Due() && !Send(*p, bytes, setup)) throw Error(p->last_error);
    Poll(*p);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::printf("connect-version: sent a CONNECT of wire version %u; %zu answers%s%s\n",
              unsigned{next}, p->received,
              p->last_text.empty() ? "" : ", the last: ", p->last_text.c_str());
  Leave(0);
}
void Attack::ConnectDie() {
  // A CONNECT, then gone at once, before any answer: dead (SIGKILL), or closing its
  // endpoint and exiting. The server's ACCEPT goes to an endpoint that is gone, and over
  // shm the CONNECT may be read from a region that is.
  auto p = Open(options, server, true);
  RegisterRegion(*p, 1 << 20);
  if (!SendMessage(*p, ConnectOf(*p, 1 << 20), deadline)) throw Error(p->last_error);
  std::printf("%s: sent a CONNECT, leaving\n", what.c_str());
  std::fflush(stdout);
  if (what == "connect-die") kill(getpid(), SIGKILL);
  p.reset();  // its endpoint closed, as a program that exits does
  Leave(0);
}
void Attack::StrangerBye() {
  // A process that never connected sends BYE, a TRANSFER and a malformed message, --count
  // times: none may be credited to a connected client (shm in libfabric 1.17 names a
  // connected peer as their source).
  auto p = Open(options, server, false);
  // The first one may wait for rxm's tcp connection: set-up time, not the attack's.
  const Clock::time_point start = Clock::now();
  uint64_t sent = SendMessage(*p, wire::Bye{}, deadline);
  deadline += Clock::now() - start;
  for (uint64_t i = 0; i < count && Clock::now() < deadline; ++i) {
    sent += SendMessage(*p, wire::Bye{}, deadline);
    sent += SendMessage(*p, TransferOf(1, 2000, 4096, 1), deadline);
    sent += Send(*p, std::vector<uint8_t>(64, 0x5a), deadline);
    WaitFor(
        *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(50));
  }
  std::printf("stranger-bye: sent %llu messages without ever connecting\n",
              static_cast<unsigned long long>(sent));
  Leave(0);
}
void Attack::ForgeClient() {
  // Messages to a 07 client's control endpoint (the last address of its --address-file)
  // that its server never sent: random bytes, a well-formed ERROR and DONE, each --count
  // times. The client must finish its transfer as if none had come.
  auto addresses = ReadAddressList(victim);
  auto p = Open(options, addresses.back(), false);
  uint64_t sent = 0;
  for (uint64_t i = 0; i < count && Clock::now() < deadline; ++i) {
    std::vector<uint8_t> noise(48);
    for (auto& b : noise) b = static_cast<uint8_t>(wire::NewToken());
    sent += Send(*p, noise, deadline);
    sent += SendMessage(*p, wire::ErrorReply{1, "forged by a stranger"}, deadline);
    sent += SendMessage(*p, wire::Done{1, 1, 1, 5531000000000ull}, deadline);
    WaitFor(
        *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(20));
  }
  std::printf("forge-client: sent %llu forged messages\n", static_cast<unsigned long long>(sent));
  Leave(0);
}
void Attack::Deaf() {
  // Connects, then never posts a receive again and never reads a completion, while
  // asking for pages outside its region: every answer the server sends finds no buffer.
  auto p = Open(options, server, true);
  if (!Connect(*p, ConnectOf(*p, 4096), deadline)) throw Error("no ACCEPT from the server");
  uint64_t sent = 0;
  for (; sent < count && Clock::now() < deadline; ++sent) {
    auto bytes =
        wire::Encode(TransferOf(static_cast<uint32_t>(sent + 1), 4, 1 << 20, 1), p->session);
    std::memcpy(p->buffer.data(), bytes.data(), bytes.size());
    ssize_t rc = -FI_EAGAIN;
    while (rc == -FI_EAGAIN && Clock::now() < deadline)
      rc = fi_send(p->ep.get(), p->buffer.data(), bytes.size(), fi_mr_desc(p->mr.get()), p->server,
                   &p->contexts[1 + sent % 60]);
    if (rc != 0) break;
  }
  std::printf("sent %llu refused TRANSFERs without reading a completion\n",
              static_cast<unsigned long long>(sent));
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 1.0)));
  Leave(0);
}
// --count clients connect and stay, from endpoints of their own
void Attack::Flood() {
  // All endpoints first, then the CONNECTs back to back: opening one can take a while
  // (tcp), and the server must see the whole flood while its first clients are in.
  // (All --count of them, deadline or not: the tests count them, and opening one is
  // bounded; on a loaded host a tcp endpoint can take a second.)
  std::vector<std::unique_ptr<Peer>> peers;
  for (uint64_t i = 0; i < count; ++i) peers.push_back(Open(options, server, true));
  // The exchange gets --seconds of its own, counted once every endpoint is open.
  const Clock::time_point answered_by = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double>(seconds));
  for (auto& p : peers) SendMessage(*p, ConnectOf(*p, 1 << 20), answered_by);
  size_t accepted = 0, refused = 0;
  std::string refusal;
  for (auto& p : peers) {
    AwaitAnswer(*p, ConnectOf(*p, 1 << 20), 0, answered_by);
    if (p->last_text == "ACCEPT") {
      ++accepted;
    } else if (!p->last_text.empty()) {
      ++refused;
      if (refusal.empty()) refusal = p->last_text;
    }
  }
  std::printf("flood: %zu clients, %zu accepted, %zu refused%s%s\n", peers.size(), accepted,
              refused, refused ? ": " : "", refusal.c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(hold));
  Leave(0);
}
void Attack::Requests() {
  auto p = Open(options, server, true);
  const bool big = what == "big-requests";
  const uint64_t region = big ? (4ull << 30) : (64ull << 20);
  if (!big) RegisterRegion(*p, region);  // a real one: its WRITEs land and complete
  if (!Connect(*p, ConnectOf(*p, region, {}, big ? (3ull << 30) : (1 << 20)), deadline))
    throw Error("no answer to CONNECT from the server");
  if (p->last_text != "ACCEPT") {  // 07 weighs the memory asked for at CONNECT
    std::printf("%s: refused at CONNECT: %s\n", what.c_str(), p->last_text.c_str());
    Leave(0);
  }
  std::vector<wire::Transfer> requests;
  if (what == "big-requests")  // three requests of 1 GiB: 8192 pages of 128 KiB
    for (uint32_t i = 1; i <= 3; ++i) requests.push_back(TransferOf(i, 8192, 128 << 10, 1));
  if (what == "repeat-bye") requests.push_back(TransferOf(1, 64, 4096, wire::kMaxRepeat));
  if (what == "transfer-bye") requests.push_back(TransferOf(1, 1024, 64 << 10, 64));
  if (what == "many-requests")
    for (uint32_t i = 1; i <= count; ++i) requests.push_back(TransferOf(i, 4, 4096, 1000));
  if (what == "bad-page") {  // 16 pages of 4 KiB, the last one page past the region's end
    requests.push_back(TransferOf(1, 16, 4096, 1));
    requests.back().pages.back() = static_cast<uint32_t>(region / 4096);
  }
  for (const auto& r : requests)
    if (!SendMessage(*p, r, deadline)) throw Error(p->last_error);
  if (what == "bad-page")  // its answer, before BYE
    WaitFor(
        *p, [&] { return p->last_text != "ACCEPT"; }, deadline);
  // The server WRITEs into an address nothing of ours is registered at, with a key we did
  // not give out: those fail on its side. What we receive are its refusals, if any.
  if (what == "big-requests" || what == "many-requests")
    WaitFor(
        *p, [&] { return false; }, Clock::now() + std::chrono::seconds(1));
  if (what != "silent" && !SendMessage(*p, wire::Bye{}, deadline)) throw Error(p->last_error);
  WaitFor(
      *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(300));
  std::printf("%s: sent %zu requests%s; server said: %s\n", what.c_str(), requests.size(),
              what == "silent" ? ", then nothing" : " and BYE",
              p->last_text.empty() ? "(nothing)" : p->last_text.c_str());
  if (what == "silent") std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  Leave(0);
}
// every malformed message, then a good CONNECT and its own
void Attack::MalformedMessages() {
  auto p = Open(options, server, true);
  size_t sent = 0;
  for (auto& [name, bytes] : Malformed(*p)) {
    if (Send(*p, bytes, deadline)) ++sent;
    WaitFor(
        *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(20));
  }
  // The same breakages from a connected client, which the server answers with ERROR.
  Connect(*p, ConnectOf(*p, 1 << 20), deadline);
  const size_t before = p->received;
  for (auto& [name, bytes] : Malformed(*p)) {
    if (Send(*p, Stamped(*p, bytes), deadline)) ++sent;
    WaitFor(
        *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(20));
  }
  WaitFor(
      *p, [&] { return false; }, Clock::now() + std::chrono::milliseconds(500));
  if (!SendMessage(*p, wire::Bye{}, deadline)) throw Error(p->last_error);
  std::printf("malformed: sent %zu messages (%zu kinds, twice), %zu answers\n", sent,
              Malformed(*p).size(), p->received - before);
  Leave(0);
}
void Attack::ClaimLane() {
  // A CONNECT from an endpoint of our own whose lane is the victim's first lane, sent again
  // and again as a client sends its own, for --seconds: answered, it would have the server
  // write into the victim's region with the victim's keys.
  auto addresses = ReadAddressList(victim);
  if (lane >= addresses.size())
    throw UsageError("--lane " + std::to_string(lane) + ": the victim has " +
                     std::to_string(addresses.size()) + " lanes");
  auto p = Open(options, server, true);
  // Lanes 0..K-1 ours, lane K the victim's lane K (--lane K).
  wire::Connect c = ConnectOf(*p, 1 << 20);
  c.lanes.assign(lane + 1, c.lanes[0]);
  c.lanes[lane].address = Respell(addresses[lane], spelling, *p->info);
  c.reply = p->Address();
  common::ConnectRepeat again;
  uint64_t sent = 0;
  while (Clock::now() < deadline) {
    if (again.Due()) sent += SendMessage(*p, c, deadline);
    Poll(*p);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::printf("claim-lane: sent %llu CONNECTs naming the victim's lane; %zu answers%s%s\n",
              static_cast<unsigned long long>(sent), p->received,
              p->last_text.empty() ? "" : ", the last: ", p->last_text.c_str());
  Leave(0);
}
void Attack::StrangerWrite() {
  // WRITEs into a victim's region from a process it never heard of, trying the keys a
  // program that numbers its registrations would give out (0, 1, 2...) at offset 0 and at
  // the second page. Each key from an endpoint of its own: a provider may close a
  // connection over a bad key, and the next key must still get its chance. The provider
  // enforces keys: with keys nobody can guess, none lands.
  auto addresses = ReadAddressList(victim);
  uint64_t tried = 0, done = 0, refused = 0;
  std::string last;
  for (uint64_t key = 0; key < count && Clock::now() < deadline; ++key) {
    auto p = Open(options, server, false);
    fi_addr_t target = FI_ADDR_UNSPEC;
    if (fi_av_insert(p->av.get(), addresses[0].data(), 1, &target, 0, nullptr) != 1)
      throw Error("victim address not accepted");
    uint64_t posted = 0;
    for (uint64_t offset : {uint64_t{0}, uint64_t{4096}}) {
      ssize_t rc = -FI_EAGAIN;
      // Over tcp with FI_DELIVERY_COMPLETE: the completion waits for the target's verdict,
      // so a WRITE refused there fails here (without it, tcp completes one once it is in
      // the socket). shm completes a WRITE only after its copy anyway (and 1.17's never
      // completes one asked for with the flag).
      iovec iov{p->buffer.data(), 4096};
      void* desc = fi_mr_desc(p->mr.get());
      fi_rma_iov rma{offset, 4096, key};
      fi_msg_rma msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = target;
      msg.rma_iov = &rma;
      msg.rma_iov_count = 1;
      msg.context = &p->contexts[1 + posted];
      msg.data = 1;
      while (rc == -FI_EAGAIN && Clock::now() < deadline) {
        rc = fi_writemsg(p->ep.get(), &msg,
                         FI_REMOTE_CQ_DATA | (tcp ? FI_DELIVERY_COMPLETE : uint64_t{0}));
        if (rc == -FI_EAGAIN) Poll(*p);
      }
      if (rc == 0) ++posted;
    }
    WaitFor(
        *p, [&] { return p->sends + p->errors >= posted; },
        std::min(deadline, Clock::now() + std::chrono::seconds(2)));
    tried += posted;
    done += p->sends;
    refused += p->errors;
    if (!p->last_error.empty()) last = p->last_error;
  }
  std::printf("stranger-write: %llu WRITEs tried, %llu done at our end, %llu refused%s%s\n",
              static_cast<unsigned long long>(tried), static_cast<unsigned long long>(done),
              static_cast<unsigned long long>(refused), last.empty() ? "" : ": ", last.c_str());
  Leave(0);
}

const std::map<std::string, void (Attack::*)()> kCases = {
    {"oversize", &Attack::Oversize},
    {"connect-nowhere", &Attack::ConnectNowhere},
    {"connect-fake-shm", &Attack::ConnectNowhere},
    {"connect-reflect", &Attack::ConnectReflect},
    {"connect-self", &Attack::ConnectSelf},
    {"bye-then-big", &Attack::ByeThenBig},
    {"transfer-die", &Attack::TransferDie},
    {"connect-version", &Attack::ConnectVersion},
    {"connect-die", &Attack::ConnectDie},
    {"connect-exit", &Attack::ConnectDie},
    {"stranger-bye", &Attack::StrangerBye},
    {"forge-client", &Attack::ForgeClient},
    {"deaf", &Attack::Deaf},
    {"flood", &Attack::Flood},
    {"big-requests", &Attack::Requests},
    {"repeat-bye", &Attack::Requests},
    {"transfer-bye", &Attack::Requests},
    {"silent", &Attack::Requests},
    {"many-requests", &Attack::Requests},
    {"bad-page", &Attack::Requests},
    {"malformed", &Attack::MalformedMessages},
    {"claim-lane", &Attack::ClaimLane},
    {"stranger-write", &Attack::StrangerWrite},
};

int main(int argc, char** argv) {
  Attack a;
  uint32_t stage = 7;
  CLI::App app{"A misbehaving client for the tests (see the header of hostile_peer.cpp)",
               "hostile_peer"};
  AddOptions(app, a.options, kServeOptions);
  app.add_option("case", a.what, "What to do")->required();
  app.add_option("--count", a.count, "How many times (clients, messages, WRITEs)");
  app.add_option("--seconds", a.seconds,
                 "Bound of every loop (getting in, the first SEND and an answered CONNECT, gets "
                 "at least 30 s more)");
  app.add_option("--hold", a.hold, "flood: seconds its clients stay after the answers");
  app.add_option("--victim", a.victim,
                 "stranger-write, forge-client, claim-lane: a file with the victim's addresses");
  app.add_option("--spelling", a.spelling,
                 "claim-lane: how the victim's lane is written: same, bare (shm: no fi_shm://), "
                 "scheme (shm: fi_ns://), tail (shm: bytes after the NUL; tcp: sin_zero set)");
  app.add_option("--lane", a.lane,
                 "claim-lane: the victim's lane K, as our lane K (lanes before it our own)");
  app.add_option("--stage", stage,
                 "The stage its messages say it is (that of the server under attack: a server "
                 "refuses a client of another stage at once)")
      ->check(CLI::Range(1, 7));
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  return RunProgram("hostile_peer", [&]() -> int {
    const auto run = kCases.find(a.what);
    if (run == kCases.end()) throw UsageError("unknown case '" + a.what + "'");
    wire::SetOwnStage(stage);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    a.server = FromHex(a.options.peer);
    a.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(a.seconds));
    a.tcp = CanonicalProvider(a.options.provider).rfind("tcp", 0) == 0;
    (a.*run->second)();  // each case ends the process
    return kExitFailure;
  });
}
