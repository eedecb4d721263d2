// 07's service machinery: what a server needs to serve many clients at once, and none of the
// ladder, so that main.cpp reads as the engine and its optimizations (README.md, "One
// engine, many peers"). The service owns the control endpoint on the first NIC and puts it on the
// front desk that 03 to 06 use (common/reception.hpp: admission, tokens, departures, limits); it
// keeps each client's session in the engine to its limits (--max-requests, and
// --client-memory through the engine), answers every request with DONE or ERROR, notices a
// client whose WRITEs stop, and never lets one client hold up another. The engine
// (engine.cpp) adds, feeds and removes a client through the two interfaces below.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "options.hpp"
#include "peer_process.hpp"
#include "protocol.hpp"
#include "report.hpp"

namespace service {

namespace wire = common::wire;
using Clock = std::chrono::steady_clock;

// One client in the engine: its entries in the engine's address vectors, its region, keys,
// window and requests.
class Session {
 public:
  virtual ~Session() = default;
  // The addresses its WRITEs come from, one per lane: ACCEPT carries them.
  virtual std::vector<std::vector<uint8_t>> Writers() const = 0;
  // "2 lanes, 1 thread, pinned, ...": the server's line for the client.
  virtual std::string Describe() const = 0;
  // The bytes of the data set each of the engine's source buffers holds (ACCEPT carries it).
  virtual uint64_t SourceBytes() const = 0;
  // Hands a validated request to the data threads; "" or why it cannot be served.
  virtual std::string Dispatch(wire::Transfer transfer) = 0;
  // What happened since the last call: requests finished, a failure (a WRITE failed, a data
  // thread is stuck in the provider), when a WRITE last completed, and the threads whose
  // WRITEs stopped completing, each told once per stall (what the thread did meanwhile).
  struct Report {
    std::vector<wire::Done> finished;
    std::string failure;
    Clock::time_point last_completion{};
    std::vector<std::string> stalls;
  };
  virtual Report Poll() = 0;
  // Whether its process is still there, as far as this host can see (common/peer_process.hpp):
  // a silent client that is there is slow, not dead.
  virtual common::PeerProcess Process() const = 0;
  // What waiting for a silent client costs the others, where the provider makes it cost
  // something ("" where it costs them nothing).
  virtual std::string WaitingCosts() const { return ""; }
  // Leaves the engine: the first call starts it (its threads take no new WRITE for it; those
  // in flight complete or fail, then its AV entries go) and returns at once; call it again
  // until it says done, or stuck: a thread still holds WRITEs of its a few seconds on (they
  // never complete), and the session must then never be freed.
  enum class Leaving { kUnderway, kDone, kStuck };
  virtual Leaving Leave() = 0;
  // The session's totals for the server's last line about it ("131104 WRITEs, ... bytes"), and
  // as a --json session record's fields (docs/record.schema.json: writes, bytes, engine).
  virtual std::string Totals() const = 0;
  virtual void AddTotals(common::JsonRecord& record) const = 0;
};

// Opens sessions: the engine.
class Engine {
 public:
  virtual ~Engine() = default;
  // A session for this CONNECT, its lanes open and its threads started. Throws common::Error
  // (or std::exception) with the reason it cannot be: the client is refused with it.
  virtual std::unique_ptr<Session> Open(const wire::Connect& connect) = 0;
  // Before Open: "" or what the client is told first, when the engine it asks for is not the
  // one there: wire::kWait and why (Open rebuilds it, which takes long), or wire::kAsIs and
  // the engine that serves it (another client is on).
  virtual std::string Notice(const wire::Engine& asked) const = 0;
  // What the engine itself has to say, asked once a round: lines for the log, and why it
  // cannot go on, if it cannot (the server then says so and exits 1, for its supervisor).
  struct Report {
    std::vector<std::string> lines;
    std::string fatal;
  };
  virtual Report Watch() { return {}; }
  // With no client connected and sessions kept (their WRITEs never left the provider), the
  // engine may reopen its lanes, which takes those WRITEs back with them: then it returns true,
  // and the kept sessions must be freed (no thread of the engine touches them any more).
  virtual bool Reclaim() { return false; }
};

// Serves clients on a control endpoint opened on `control` (the first NIC) until SIGINT or
// SIGTERM, or --exit-after clients; prints the address and one line per event. Returns the
// exit code.
int Serve(const common::Options& options, const fi_info& control, common::WaitMode wait,
          Engine& engine);

}  // namespace service
