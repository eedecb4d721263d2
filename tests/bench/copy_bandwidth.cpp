// The copy limits of this machine for the transfer stages' page pattern: one thread copying
// pages from one buffer to scattered places in another, both much larger than the caches.
//   memcpy: both buffers in one process, the plain memory-bandwidth limit of one core;
//   cma:    into another process with process_vm_writev (cross-memory attach), the single
//           copy that libfabric's shm provider uses for RMA payloads between processes.
// With --gpu instead, the GPU's own limits (whole buffers, 1 GiB by default):
//   gpu-d2d:  cudaMemcpy from device memory to device memory (counted once: bytes moved);
//   gpu-h2d:  pinned host memory to the GPU, the staged path's copy (and its PCIe limit);
//   gpu-d2h:  the GPU to pinned host memory.
// Prints "<method>: <Gbps> Gbps (...)" lines, or JSON with --json.
#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "cuda_memory.hpp"
#include "error.hpp"
#include "host_buffer.hpp"
#include "options.hpp"
#include "page_data.hpp"
#include "program.hpp"
#include "report.hpp"

using namespace common;

namespace {

double TimeIt(uint64_t repeat, const std::function<void()>& pass) {
  pass();  // warm: fault in every page first
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t r = 0; r < repeat; ++r) pass();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Report(const char* method, uint64_t bytes, double seconds, uint64_t page_size, bool json) {
  if (json)
    std::printf("{\"method\":\"%s\",\"bytes\":%llu,\"seconds\":%.6f,\"gbps\":%.3f}\n", method,
                static_cast<unsigned long long>(bytes), seconds, Gbps(bytes, seconds));
  else
    std::printf("%s: %.3f Gbps (%llu bytes in %.3f s, pages of %llu bytes)\n", method,
                Gbps(bytes, seconds), static_cast<unsigned long long>(bytes), seconds,
                static_cast<unsigned long long>(page_size));
}

// The GPU's copy limits; throws HardwareAbsent (exit 77) without a GPU.
void GpuLimits(uint64_t bytes, uint64_t repeat, bool json) {
  CudaBuffer a(bytes, 0), b(bytes, 0);
  PinnedBuffer host(bytes);
  std::memset(host.data(), 1, bytes);
  Report("gpu-d2d", bytes * repeat, TimeIt(repeat, [&] { b.CopyFrom(0, a, 0, bytes); }), bytes,
         json);
  Report("gpu-h2d", bytes * repeat, TimeIt(repeat, [&] { a.CopyFromHost(0, host.data(), bytes); }),
         bytes, json);
  Report("gpu-d2h", bytes * repeat, TimeIt(repeat, [&] { a.CopyToHost(host.data(), 0, bytes); }),
         bytes, json);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t page_size = 64 * 1024, pages = 4096, repeat = 10;
  bool json = false, gpu = false;
  uint64_t gpu_bytes = 1ull << 30;
  CLI::App app{
      "Single-thread copy bandwidth (memcpy, and process_vm_writev into another "
      "process) with the page pattern of the transfer stages",
      "copy_bandwidth"};
  app.add_option_function<std::string>(
      "-S,--page-size", [&](const std::string& s) { page_size = ParseSize(s, "--page-size"); },
      "Bytes per page (default 64k)");
  app.add_option_function<std::string>(
      "--pages", [&](const std::string& s) { pages = ParseSize(s, "--pages"); },
      "Pages per pass (default 4096)");
  app.add_option("--repeat", repeat, "Passes (default 10)");
  app.add_flag("--json", json, "JSON lines");
  app.add_flag("--gpu", gpu, "The GPU's copy limits instead (exit 77 without a GPU)");
  app.add_option_function<std::string>(
      "--gpu-bytes", [&](const std::string& s) { gpu_bytes = ParseSize(s, "--gpu-bytes"); },
      "Bytes per GPU copy (default 1g)");
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  return RunProgram("copy_bandwidth", [&] {
    if (gpu) {
      GpuLimits(gpu_bytes, repeat, json);
      return 0;
    }
    const uint64_t region_pages = 2 * pages, bytes = pages * page_size * repeat;
    HostBuffer source(pages * page_size), region(region_pages * page_size);
    const auto targets = SamplePages(1, pages, region_pages);
    for (uint64_t i = 0; i < pages; ++i)
      FillPage({source.data() + i * page_size, page_size}, 1, targets[i]);

    double seconds = TimeIt(repeat, [&] {
      for (uint64_t i = 0; i < pages; ++i)
        std::memcpy(region.data() + targets[i] * page_size, source.data() + i * page_size,
                    page_size);
    });
    for (uint64_t i = 0; i < pages; ++i)  // prove the copies happened
      if (VerifyPage({region.data() + targets[i] * page_size, page_size}, 1, targets[i]) != kPageOk)
        throw Error("memcpy produced wrong data");
    Report("memcpy", bytes, seconds, page_size, json);

    // The child gets a fresh region at the same address (not the parent's copy-on-write
    // pages), on huge pages as HostBuffer's are, and then only waits to be written to.
    int ready[2];
    if (pipe(ready) != 0) throw Error("pipe failed");
    pid_t child = fork();
    if (child == 0) {
      void* p = mmap(region.data(), region.size(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p != MAP_FAILED) {
        madvise(p, region.size(), MADV_HUGEPAGE);
        std::memset(p, 0, region.size());
      }
      char ok = p != MAP_FAILED;
      if (write(ready[1], &ok, 1) != 1) _exit(1);
      for (;;) pause();
    }
    char ok = 0;
    if (read(ready[0], &ok, 1) != 1 || !ok) throw Error("the child could not map its region");
    try {
      seconds = TimeIt(repeat, [&] {
        for (uint64_t i = 0; i < pages; ++i) {
          iovec local{source.data() + i * page_size, page_size};
          iovec remote{region.data() + targets[i] * page_size, page_size};
          if (process_vm_writev(child, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(page_size))
            throw Error(std::string("process_vm_writev: ") + std::strerror(errno));
        }
      });
    } catch (...) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      throw;
    }
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    Report("cma", bytes, seconds, page_size, json);
    return 0;
  });
}
