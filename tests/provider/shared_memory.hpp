// Where a lock lives: the locks of interest are in shm's regions, files mapped from /dev/shm.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

// The /dev/shm file whose mapping holds `p` (a shm region, ours or a peer's), or "".
inline std::string SharedMemoryFileOf(const volatile void* p) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return "";
  char line[512];
  std::string found;
  const auto at = reinterpret_cast<uintptr_t>(const_cast<const void*>(p));
  while (found.empty() && std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long begin = 0, end = 0;
    char path[256] = "";
    if (std::sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &begin, &end, path) >= 2 &&
        at >= begin && at < end && std::strncmp(path, "/dev/shm/", 9) == 0)
      found = path;
  }
  std::fclose(maps);
  return found;
}
