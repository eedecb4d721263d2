// Command-line options shared by every stage (docs/architecture.md, "Programs"), parsed with
// CLI11. A stage names the groups it uses; a tool with switches of its own adds them to a
// CLI::App of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// CLI11 is included by options.cpp and by the few tools that add switches of their own, not
// here: its header alone costs each file that includes it about 9 s of compiling (-O2 -g).
namespace CLI {
class App;
}

namespace common {

enum class MemoryKind { kAuto, kHost, kCuda, kCudaVmm };
// cuda or cuda-vmm: GPU memory, from cudaMalloc or mapped by the CUDA virtual memory API.
inline bool IsGpu(MemoryKind kind) {
  return kind == MemoryKind::kCuda || kind == MemoryKind::kCudaVmm;
}
enum class WaitMode { kAuto, kSpin, kBlock };
// GPU memory: handed to the provider (direct), or staged through pinned host memory.
enum class GpuPathMode { kAuto, kDirect, kStaged };
// How GPU memory is registered (07 --dmabuf): as a dmabuf, by its address (the NIC driver pins
// it: nvidia_peermem, or the efa driver's own GPUDirect path), or dmabuf then address.
enum class DmabufMode { kAuto, kOn, kOff };
// 07: which WRITEs of a request carry its immediate data (--immediate).
enum class ImmediateMode { kEvery, kLast };

struct Options {
  // Connection: no peer address means "serve".
  std::string peer;
  std::string provider;  // empty: efa, verbs;ofi_rxm, tcp;ofi_rxm, whichever answers first
  std::string fabric;    // empty: the provider's default fabric (efa: "efa", not "efa-direct")
  std::string domain;
  std::string topology;   // 07 --topology: plan as on the machine this hwloc XML describes
  std::vector<int> gpus;  // 07 --gpus: CUDA device indices to use (empty: every one it sees)
  std::string address_file;
  std::vector<std::string> oob;  // --oob-port PORT (server) or PORT HOST (client), as given
  uint16_t oob_port = 0;         // server: also give the address on this TCP port (0: no)
  uint64_t max_clients = 16;     // server: clients connected at once; one more is refused
  uint64_t exit_after = 0;       // server: exit after serving this many clients (0: never)
  double timeout_s = 10;         // how long to wait for a peer (client: its server) to answer
  // 01 and 02
  std::string text = "Hello, world!";
  // Transfers (03 onward)
  MemoryKind memory = MemoryKind::kAuto;
  GpuPathMode gpu_path = GpuPathMode::kAuto;
  DmabufMode dmabuf = DmabufMode::kAuto;  // 07 --dmabuf
  uint64_t page_size = 64 * 1024;
  uint64_t pages = 1024;
  uint64_t repeat = 1;
  uint64_t seed = 1;
  bool json = false;
  int output_level = 0;  // -q: -1, -v: 1 (common/report.hpp, SetOutputLevel)
  uint64_t window = 64;
  uint64_t requests = 4;                // TRANSFER requests in flight per client (04 onward)
  uint64_t max_requests = 64;           // server: requests in flight per client, at most
  uint64_t client_memory = 1ull << 30;  // server: source memory per client, at most
  uint64_t server_memory = 4ull << 30;  // server: source memory of all clients, at most
  double progress_every = 0;            // 07 client: 0: 1 s on a terminal, 5 s otherwise
  double link_gbps = 0;                 // 0: sum of the link speeds libfabric reports
  uint64_t warmup = 0;
  double start_at = 0;  // 07 client: Unix time of its first timed request; 0: at once
  // Lanes (06 onward)
  uint64_t nics = 0;  // 0: every NIC of the group
  WaitMode wait = WaitMode::kAuto;
  // The engine of 07: each optimization behind its own switch, all on by default.
  bool warm = true;        // --no-warmup
  uint64_t threads = 0;    // data threads; 0: one per topology group
  bool pin = true;         // --no-pin
  bool shard = true;       // --no-shard
  uint64_t batch = 16;     // WRITEs prepared per lane per visit of the posting loop
  uint64_t doorbell = 16;  // WRITEs per doorbell: FI_MORE on all but the last of each group
  bool lazy = true;        // --eager-post
  bool numa = true;        // --no-numa
  ImmediateMode immediate = ImmediateMode::kEvery;
  bool ladder = false;
  uint64_t runs = 3;           // --ladder: timed runs per rung
  double min_seconds = 1;      // --ladder: each run at least this long (0: as --repeat says)
  double peer_timeout_s = 10;  // server: a connected client silent this long is dropped (03 on)
  bool check = false;          // 07 --check: the preflight of this host instead of a run
};

// Option groups a stage can ask for, by the first stage that teaches them.
enum OptionGroup : unsigned {
  kServeOptions = 1u << 0,     // -p, --fabric, --domain, --address-file, --exit-after,
                               // --timeout
  kTextOptions = 1u << 1,      // positional TEXT
  kTransferOptions = 1u << 2,  // --max-clients, --client-memory, --server-memory,
                               // --peer-timeout, --memory, --gpu-path, -S, --pages,
                               // --repeat, --seed, test switches
  kWindowOptions = 1u << 3,    // -W, --requests, --json, --link-gbps, --max-requests
  kWarmupOptions = 1u << 4,    // -w, --start-at
  kLaneOptions = 1u << 5,      // --nics, --wait
  kEngineOptions = 1u << 6,    // 07's switches, --ladder (client options: a server given one
                               // is told so)
  kHostOptions = 1u << 7,      // 07: --topology, --gpus, --check
};

// Parses a stage's command line into `options`: the groups' options, `about` for --help.
// Returns -1 to go on, or the exit code to return now (0 after --help, 2 after bad usage,
// with one line on stderr naming the bad value).
int ParseCommandLine(int argc, char** argv, const char* about, const char* program, unsigned groups,
                     Options& options);

// The same in two steps, for a tool that adds switches of its own to `app` in between.
void AddOptions(CLI::App& app, Options& options, unsigned groups);

// The options only a client has (07): its posting settings, sent in its CONNECT, and when it
// starts (--start-at), named for error messages. The engine's shape (--threads, --no-pin,
// --no-shard, --no-numa) is the server's at start, and what a client asks for.
inline constexpr const char* kEngineOptionNames[] = {
    "--no-warmup", "-w",     "--batch",       "--doorbell", "--eager-post", "--immediate",
    "--ladder",    "--runs", "--min-seconds", "-W",         "--start-at"};

int ParseCommandLine(CLI::App& app, int argc, char** argv);

// "64k" -> 65536; suffixes k, m, g, t (powers of 1024). Throws UsageError naming `what`.
uint64_t ParseSize(const std::string& text, const std::string& what);

// A client's request as the wire allows it (03 on): --page-size, --pages, their product and
// --repeat within common/protocol.hpp's limits. Throws UsageError naming the bad value.
void CheckRequestSize(const Options& options);

const char* MemoryName(MemoryKind kind);

}  // namespace common
