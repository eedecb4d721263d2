#include "options.hpp"

#include <rdma/fabric.h>
#include <CLI/CLI.hpp>

#include "error.hpp"
#include "oob.hpp"
#include "protocol.hpp"
#include "provider_watch.hpp"
#include "report.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

namespace common {

uint64_t ParseSize(const std::string& text, const std::string& what) {
  size_t used = 0;
  unsigned long long value = 0;
  bool ok = !text.empty() && std::isdigit(static_cast<unsigned char>(text[0]));
  if (ok) {
    try {
      value = std::stoull(text, &used);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  int shift = 0;
  if (ok && used < text.size()) {
    std::string suffix = text.substr(used);
    for (auto& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (suffix == "k" || suffix == "kb" || suffix == "kib")
      shift = 10;
    else if (suffix == "m" || suffix == "mb" || suffix == "mib")
      shift = 20;
    else if (suffix == "g" || suffix == "gb" || suffix == "gib")
      shift = 30;
    else if (suffix == "t" || suffix == "tb" || suffix == "tib")
      shift = 40;
    else
      ok = false;
  }
  if (ok && shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) ok = false;
  if (!ok)
    throw UsageError("invalid size '" + text + "' for " + what + " (use a number with an " +
                     "optional k, m or g suffix, e.g. 64k)");
  return static_cast<uint64_t>(value) << shift;
}

const char* MemoryName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
    case MemoryKind::kCudaVmm:
      return "cuda-vmm";
    default:
      return "auto";
  }
}

// The values a numeric option may take: what a server can actually serve, or a client ask.
struct Range {
  uint64_t lo = 0, hi = UINT64_MAX;
};
constexpr uint64_t kTiB = 1ull << 40;

// 65536 as "64k", 1 TiB as "1t": as --help and ParseSize spell sizes.
static std::string FormatSize(uint64_t v) {
  const char* units = "kmgt";
  int unit = -1;
  while (unit < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++unit;
  }
  return std::to_string(v) + (unit >= 0 ? std::string(1, units[unit]) : "");
}

static void AddSize(CLI::App& app, const std::string& names, uint64_t* value,
                    const std::string& help, const char* type = "SIZE", Range range = {}) {
  std::string what = names.substr(names.rfind(',') + 1);
  auto* opt = app.add_option_function<std::string>(
      names,
      [value, what, range, bytes = std::string(type) == "SIZE"](const std::string& text) {
        const uint64_t v = ParseSize(text, what);
        auto say = [bytes](uint64_t n) { return bytes ? FormatSize(n) : std::to_string(n); };
        if (v < range.lo || v > range.hi)
          throw UsageError("invalid " + what + " " + text + " (" + say(range.lo) + " to " +
                           say(range.hi) + ")");
        *value = v;
      },
      help);
  opt->type_name(type)->default_str(std::to_string(*value));
}

static void AddSeconds(CLI::App& app, const std::string& names, double* value,
                       const std::string& help, bool zero = false) {
  std::string what = names.substr(names.rfind(',') + 1);
  auto* opt = app.add_option_function<std::string>(
      names,
      [value, what, zero](const std::string& text) {
        size_t used = 0;
        double v = -1;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
        }
        if (used != text.size() || !((v > 0 || (zero && v == 0)) && v <= 86400))
          throw UsageError("invalid value '" + text + "' for " + what + " (seconds, " +
                           (zero ? "0" : "more than 0") + " to 86400)");
        *value = v;
      },
      help);
  opt->type_name("SECONDS")->default_str(std::to_string(*value).substr(0, 4));
}

// An option that takes one of a few words, each standing for a value: anything else is refused
// with the words ("invalid --wait 'maybe' (use spin or block)").
template <typename T>
static void AddChoice(CLI::App& app, const std::string& name, T* value,
                      std::vector<std::pair<std::string, T>> choices, const std::string& help) {
  std::string words, names;
  for (size_t i = 0; i < choices.size(); ++i) {
    words += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i].first;
    names += (i == 0 ? "" : "|") + choices[i].first;
  }
  app.add_option_function<std::string>(
         name,
         [=](const std::string& m) {
           for (const auto& [word, v] : choices)
             if (m == word) {
               *value = v;
               return;
             }
           throw UsageError("invalid " + name + " '" + m + "' (use " + words + ")");
         },
         help)
      ->type_name(names);
}

// A switch that turns something off: --no-pin sets *value to false.
static void AddOff(CLI::App& app, const std::string& name, bool* value, const std::string& help) {
  app.add_flag_callback(
      name, [value] { *value = false; }, help);
}

static void AddTextOptions(CLI::App& app, Options& o) {
  app.add_option("text", o.text, "Message the client sends")->capture_default_str();
}
static void AddServeOptions(CLI::App& app, Options& o) {
  app.add_option("-p,--provider", o.provider,
                 "libfabric provider: efa, verbs, tcp, shm, ... (default: first of efa, "
                 "verbs;ofi_rxm, tcp;ofi_rxm that works here)");
  app.add_option("--fabric", o.fabric,
                 "libfabric fabric of the provider: for efa, efa (default: the full RDM "
                 "protocol) or efa-direct (the device's own queues; see 07's README)");
  app.add_option("--domain", o.domain,
                 "libfabric domain (NIC) to use, as fi_info names it: lo, eth0, or efa's "
                 "rdmap79s0-rdm");
  app.add_option("--oob-port", o.oob,
                 "Server: also give the address (hex) to whoever connects to this TCP port. "
                 "Client: --oob-port PORT HOST takes it from there instead of the address "
                 "argument, waiting for the server to answer up to 60 s (--timeout, if given)")
      ->expected(1, 2)
      ->type_name("PORT [HOST]");
  app.add_option("--address-file", o.address_file,
                 "Server: also write the address (hex) to this file (07 client: its lane "
                 "addresses)");
  AddSize(app, "--exit-after", &o.exit_after,
          "Server: exit after serving this many clients (default 0: until SIGINT/SIGTERM)", "N",
          Range{0, 1ull << 32});
  AddSeconds(app, "--timeout", &o.timeout_s,
             "Seconds to wait for the peer: a client for its server's answers, a server for "
             "a client to take its messages");
}
static void AddTransferOptions(CLI::App& app, Options& o) {
  app.add_flag_function(
         "-q,--quiet", [&o](int64_t) { o.output_level = -1; },
         "Print only the summary and errors (a server: its address and errors)")
      ->excludes("--verbose");
  AddSize(app, "--client-memory", &o.client_memory,
          "Server (03-06): source memory a client's requests may hold at once; more is refused",
          "SIZE", Range{1, kTiB});
  AddSize(app, "--server-memory", &o.server_memory,
          "Server: source memory. 03-06: what all clients' requests may hold at once (more is "
          "refused); 07: its source pages, made once at start and read by every request",
          "SIZE", Range{1, kTiB});
  AddSize(app, "--max-clients", &o.max_clients,
          "Server: clients connected at once; one more is refused with an ERROR (0: no limit)", "N",
          Range{0, 1u << 16});
  AddSeconds(app, "--peer-timeout", &o.peer_timeout_s,
             "Server: drop a connected client with no sign of life (no message, no WRITE "
             "completed) for this long; 07 drops one with WRITEs in flight only once its process "
             "is seen gone (shm, tcp), or after this where nothing can be seen (efa)");
  AddChoice(app, "--memory", &o.memory,
            {{"host", MemoryKind::kHost},
             {"cuda", MemoryKind::kCuda},
             {"cuda-vmm", MemoryKind::kCudaVmm}},
            "Memory for the pages: host, cuda (cudaMalloc) or cuda-vmm (mapped in chunks by "
            "the CUDA virtual memory API, as PyTorch's expandable segments; default: cuda when "
            "a GPU is present)");
  AddChoice(app, "--gpu-path", &o.gpu_path,
            {{"auto", GpuPathMode::kAuto},
             {"direct", GpuPathMode::kDirect},
             {"staged", GpuPathMode::kStaged}},
            "GPU memory: direct (the provider moves it; where it would copy it through host "
            "memory or cannot take it: exit 77), staged (through pinned host memory), or auto: "
            "direct where the provider takes GPU memory (default; on p4d, p5 and p6 instances, "
            "direct); the header line says which and why");
  AddSize(app, "-S,--page-size", &o.page_size, "Bytes per page (suffixes k, m, g)");
  AddSize(app, "--pages", &o.pages, "Pages per TRANSFER request", "N");
  AddSize(app, "--repeat", &o.repeat, "Times the page set is written", "N");
  app.add_option("--seed", o.seed, "Seed of the page data and page choice")->capture_default_str();
}
static void AddWindowOptions(CLI::App& app, Options& o) {
  AddSize(app, "-W,--window", &o.window, "WRITEs in flight at once: in all (05, 06), per lane (07)",
          "N", Range{1, wire::kMaxWindow});
  AddSize(app, "--requests", &o.requests, "TRANSFER requests in flight per client", "N",
          Range{1, 1u << 16});
  AddSize(app, "--max-requests", &o.max_requests,
          "Server: requests in flight per client, at most; one more is refused", "N",
          Range{1, 1u << 16});

  app.add_flag("--json", o.json,
               "Print the summary as one JSON line on stdout, and every other line on stderr");
  app.add_option("--link-gbps", o.link_gbps,
                 "Link rate for '% of link' when the provider cannot know it (tc shaping)")
      ->check(CLI::PositiveNumber);  // CLI11 names the option and the value
}
static void AddWarmupOptions(CLI::App& app, Options& o) {
  AddSize(app, "-w,--warmup", &o.warmup, "Untimed WRITEs per lane before the timed run", "N",
          Range{0, wire::kMaxRepeat});
  app.add_option_function<std::string>(
         "--start-at",
         [&o](const std::string& text) {
           size_t used = 0;
           double v = -1;
           try {
             v = std::stod(text, &used);
           } catch (const std::exception&) {
           }
           if (used != text.size() || !(v > 0))
             throw UsageError("invalid --start-at '" + text +
                              "' (Unix seconds, as date +%s.%N prints them)");
           o.start_at = v;
         },
         "Client: connect and warm up, then send the first timed request at this time (Unix "
         "seconds, e.g. $(date -d '+5 sec' +%s.%N)), so that clients started one after "
         "another are timed together; at most --timeout from the start")
      ->type_name("TIME");
}
static void AddLaneOptions(CLI::App& app, Options& o) {
  AddSize(app, "--nics", &o.nics,
          "Lanes (NICs) to use (default 0: all NICs of the group; 07: of every group)", "N",
          Range{0, wire::kMaxLanes});
  AddChoice(app, "--wait", &o.wait, {{"spin", WaitMode::kSpin}, {"block", WaitMode::kBlock}},
            "Completion wait: spin (busy poll) or block (sleep in the CQs' wait fds); default: "
            "block over tcp, whose kernel stack needs the CPUs, spin elsewhere");
}
static void AddEngineOptions(CLI::App& app, Options& o) {
  AddOff(app, "--no-warmup", &o.warm, "Client: no untimed WRITEs on every lane first");
  app.add_option("--progress-every", o.progress_every,
                 "Client: seconds between progress lines, each with the rate since the last "
                 "(default 0: each second on a terminal, every 5 s otherwise)")
      ->check(CLI::NonNegativeNumber);
  AddSize(app, "--threads", &o.threads,
          "Data threads of the server's engine (default 0: one per topology group; 1: a single "
          "thread); a client asks for them, and an idle server is rebuilt so",
          "N", Range{0, wire::kMaxLanes});
  AddOff(app, "--no-pin", &o.pin,
         "The server's data threads are not pinned to cores (server: at start; client: asks)");
  AddOff(app, "--no-shard", &o.shard,
         "The server's threads share one locked state per client instead of their own "
         "(server: at start; client: asks)");
  AddSize(app, "--batch", &o.batch,
          "Client: WRITEs a data thread of the server prepares each time round its posting loop, "
          "whatever its lanes (the published ladder's batching: 16 per GPU thread; 1: one, then "
          "poll again)",
          "N", Range{1, wire::kMaxBatch});
  AddSize(app, "--doorbell", &o.doorbell,
          "Client: WRITEs per doorbell: FI_MORE on all but the last of each group, so the "
          "provider can ring the NIC once for them (1: every WRITE rings it; efa reads FI_MORE, "
          "shm and tcp do not); where WRITEs complete once delivered (shm from libfabric 1.18), "
          "the group's last WRITE also reports the completion for all of them",
          "N", Range{1, wire::kMaxWindow});
  AddOff(app, "--eager-post", &o.lazy,
         "Client: the server posts each WRITE at once instead of from its CQ poll");
  AddChoice(app, "--immediate", &o.immediate,
            {{"every", ImmediateMode::kEvery}, {"last", ImmediateMode::kLast}},
            "Client: which WRITEs carry their request's immediate data: every (default; the "
            "receiver counts one completion per WRITE) or last, as the published run did: only "
            "the last WRITE of each lane's part of a request, posted once the others completed, "
            "and counted for them");
  AddOff(app, "--no-numa", &o.numa,
         "The server's memory is not bound to its threads' NUMA nodes (server: at start; "
         "client: asks)");
  app.add_flag("--ladder", o.ladder,
               "Client: measure each rung of the optimization ladder, one table row each: "
               "its runs' median, range and verdict against the rung below");
  AddSize(app, "--runs", &o.runs, "Client: --ladder: timed runs per rung (a session each)", "N",
          Range{1, 100});
  AddSeconds(app, "--min-seconds", &o.min_seconds,
             "Client: --ladder: each run at least this long, its --repeat sized by a "
             "calibration session at the fastest rung first (0: --repeat as given, no "
             "calibration)",
             true);
}
static void AddHostOptions(CLI::App& app, Options& o) {
  app.add_option("--topology", o.topology,
                 "Rehearse the machine this hwloc XML describes (tests/data/p5.xml: a p5): its "
                 "GPUs group this host's NICs, which take its NICs' places in order, so the "
                 "plan (groups, threads, cores) is the one made there; host memory, nothing "
                 "bound")
      ->check(CLI::ExistingFile);
  AddChoice(app, "--dmabuf", &o.dmabuf,
            {{"auto", DmabufMode::kAuto}, {"on", DmabufMode::kOn}, {"off", DmabufMode::kOff}},
            "GPU memory's registration: on (a dmabuf, or exit 77), off (by address, pinned by "
            "the NIC's driver: nvidia_peermem or efa's own GPUDirect path; sets "
            "FI_HMEM_CUDA_USE_DMABUF=0 unless set, so that the provider does not take a dmabuf "
            "itself), or auto: a dmabuf, and by address where that registration fails "
            "(default); the header and the record's memory_why say which");
  app.add_option_function<std::string>(
         "--gpus",
         [&o](const std::string& text) {
           // "3", "0,2" or "4-7": as CUDA_VISIBLE_DEVICES and Slurm write them
           static const std::regex kList(R"(\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*)");
           std::vector<int> gpus;
           if (std::regex_match(text, kList)) {
             std::stringstream items(text);
             for (std::string item; std::getline(items, item, ',');) {
               const size_t dash = item.find('-');
               const int lo = std::stoi(item.substr(0, dash));
               const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
               for (int g = lo; g <= hi; ++g)
                 if (std::find(gpus.begin(), gpus.end(), g) == gpus.end()) gpus.push_back(g);
             }
           }
           if (gpus.empty())  // not a list, or a range backwards
             throw UsageError("invalid --gpus '" + text + "' (CUDA device indices: 3, 0,2 or 4-7)");
           o.gpus = gpus;
         },
         "GPUs to use, by CUDA device index among those this process sees (3, 0,2 or 4-7; "
         "default: all), each with the NICs under its PCIe switch only, as one process per GPU "
         "runs on a p5; with --topology, indices of that machine's GPUs")
      ->type_name("LIST");
  app.add_flag("--check", o.check,
               "Check this host instead (EFA devices, GPUs, peer memory, huge pages, memlock, "
               "libfabric and its providers, GPU memory in it, the NICs of each GPU): one line "
               "each, OK, WARN or FAIL with the fix; exit 0 when ready, 1 when not");
}
// --help in groups, as a reader looks for them; an option not named here stays in "Other".
static void GroupOptions(CLI::App& app) {
  static const std::map<std::string, std::string> kGroupOf = {
      {"address", "Connection"},
      {"provider", "Connection"},
      {"fabric", "Connection"},
      {"domain", "Connection"},
      {"oob-port", "Connection"},
      {"address-file", "Connection"},
      {"timeout", "Connection"},
      {"nics", "Connection"},
      {"wait", "Connection"},
      {"exit-after", "Server"},
      {"max-clients", "Server"},
      {"peer-timeout", "Server"},
      {"max-requests", "Server"},
      {"client-memory", "Server"},
      {"server-memory", "Memory"},
      {"memory", "Memory"},
      {"gpu-path", "Memory"},
      {"text", "Request"},
      {"page-size", "Request"},
      {"pages", "Request"},
      {"repeat", "Request"},
      {"seed", "Request"},
      {"window", "Request"},
      {"requests", "Request"},
      {"warmup", "Request"},
      {"start-at", "Request"},
      {"threads", "Engine (the client asks)"},
      {"no-pin", "Engine (the client asks)"},
      {"no-shard", "Engine (the client asks)"},
      {"batch", "Engine (the client asks)"},
      {"doorbell", "Engine (the client asks)"},
      {"eager-post", "Engine (the client asks)"},
      {"immediate", "Engine (the client asks)"},
      {"no-numa", "Engine (the client asks)"},
      {"no-warmup", "Engine (the client asks)"},
      {"ladder", "Ladder"},
      {"runs", "Ladder"},
      {"min-seconds", "Ladder"},
      {"topology", "Host checks"},
      {"gpus", "Connection"},
      {"dmabuf", "Memory"},
      {"check", "Host checks"},
      {"quiet", "Output"},
      {"verbose", "Output"},
      {"json", "Output"},
      {"link-gbps", "Output"},
      {"progress-every", "Output"},
  };
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_group().empty()) continue;  // hidden
    const std::string name = opt->get_lnames().empty() ? opt->get_name() : opt->get_lnames()[0];
    const auto found = kGroupOf.find(name);
    opt->group(found != kGroupOf.end() ? found->second : "Other");
  }
}

void AddOptions(CLI::App& app, Options& o, unsigned groups) {
  app.add_option("address", o.peer,
                 "Server address (the hex after 'addr:'); without it this program is the server");
  app.add_flag_function(
      "-v,--verbose", [&o](int64_t) { o.output_level = 1; },
      "Print diagnostics too: dropped messages, unanswered CONNECTs, stalled threads");
  if (groups & kTextOptions) AddTextOptions(app, o);
  if (groups & kServeOptions) AddServeOptions(app, o);
  if (groups & kTransferOptions) AddTransferOptions(app, o);
  if (groups & kWindowOptions) AddWindowOptions(app, o);
  if (groups & kWarmupOptions) AddWarmupOptions(app, o);
  if (groups & kLaneOptions) AddLaneOptions(app, o);
  if (groups & kEngineOptions) AddEngineOptions(app, o);
  if (groups & kHostOptions) AddHostOptions(app, o);
  app.set_help_flag("-h,--help", "Print this help and exit");  // last: under "Other"
  GroupOptions(app);
}

void CheckRequestSize(const Options& options) {
  if (options.page_size == 0 || options.page_size > wire::kMaxPageBytes)
    throw UsageError("invalid --page-size " + std::to_string(options.page_size) + " (1 to " +
                     std::to_string(wire::kMaxPageBytes) + ")");
  if (options.pages == 0 || options.pages > wire::kMaxPagesPerRequest)
    throw UsageError("invalid --pages " + std::to_string(options.pages) + " (1 to " +
                     std::to_string(wire::kMaxPagesPerRequest) + " per request)");
  if (options.pages * options.page_size > wire::kMaxRequestBytes)
    throw UsageError("--pages x --page-size is " +
                     std::to_string(options.pages * options.page_size) + " bytes, over the " +
                     std::to_string(wire::kMaxRequestBytes) + " a request may hold");
  if (options.repeat == 0 || options.repeat > wire::kMaxRepeat)
    throw UsageError("invalid --repeat " + std::to_string(options.repeat));
}

// --version: the project's, and the libfabric it was built with and the one it runs on (the
// library found at run time may be another than the headers': LD_LIBRARY_PATH, the EFA
// installer's /opt/amazon/efa).
static std::string VersionText(const std::string& program) {
  const uint32_t running = fi_version();
  return program + " " PROJECT_VERSION "; libfabric " + std::to_string(FI_MAJOR_VERSION) + "." +
         std::to_string(FI_MINOR_VERSION) + "." + std::to_string(FI_REVISION_VERSION) +
         " at build, " + std::to_string(FI_MAJOR(running)) + "." +
         std::to_string(FI_MINOR(running)) + " at run time";
}

int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  const std::string program = app.get_name();
  app.set_version_flag(
         "--version", [program] { return VersionText(program); },
         "Print the project's version and libfabric's (built with, running) and exit")
      ->group("Other");
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", app.get_name().c_str(), e.what());
    return kExitUsage;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.what());
    return kExitUsage;
  }
}

// --oob-port: a server's port; a client's PORT HOST, whose answer becomes the peer's address.
// Returns an exit code, or -1 to go on.
static int TakeOobAddress(const char* program, bool timeout_given, Options& options) {
  if (options.oob.empty()) return -1;
  const std::string& port = options.oob[0];
  char* end = nullptr;
  const unsigned long value = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || port[0] == '-' || value < 1 || value > 65535) {
    std::fprintf(stderr, "%s: invalid --oob-port '%s' (a TCP port, 1 to 65535)\n", program,
                 port.c_str());
    return kExitUsage;
  }
  if (options.oob.size() == 1) {
    if (!options.peer.empty()) {
      std::fprintf(stderr,
                   "%s: --oob-port %s: a client names the server's host too (--oob-port %s HOST)\n",
                   program, port.c_str(), port.c_str());
      return kExitUsage;
    }
    options.oob_port = static_cast<uint16_t>(value);
    return -1;
  }
  if (!options.peer.empty()) {
    std::fprintf(stderr,
                 "%s: the server's address, or --oob-port PORT HOST to fetch it: not both\n",
                 program);
    return kExitUsage;
  }
  try {
    options.peer = FetchAddressFrom(options.oob[1], static_cast<uint16_t>(value),
                                    timeout_given ? options.timeout_s : 60.0);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return kExitFailure;
  }
  return -1;
}

int ParseCommandLine(int argc, char** argv, const char* about, const char* program, unsigned groups,
                     Options& options) {
  CLI::App app{about, program};
  AddOptions(app, options, groups);
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  const bool client = !options.peer.empty() || options.oob.size() == 2;  // PORT HOST: a client
  if ((groups & kEngineOptions) && !client && !options.check) {
    for (const char* name : kEngineOptionNames) {  // a client's own posting settings
      if (app.count(name) > 0) {
        std::fprintf(stderr, "%s: %s is a client option: each client sends its own\n", program,
                     name);
        return kExitUsage;
      }
    }
  }
  if (int rc = TakeOobAddress(program, app.count("--timeout") > 0, options); rc >= 0) return rc;
  if (!options.peer.empty()) SetStuckSeconds(std::max(kStuckSeconds, options.timeout_s));
  if (options.json) RecordsOnStdout();
  SetOutputLevel(options.output_level);
  RunContext& run = ThisRun();  // what the records name (report.hpp)
  run.stage = program;
  if (groups & kTransferOptions) {
    run.page_size = options.page_size;
    run.pages = options.pages;
    run.repeat = options.repeat;
  }
  if (groups & kWindowOptions) run.requests = options.requests;
  return -1;
}

}  // namespace common
