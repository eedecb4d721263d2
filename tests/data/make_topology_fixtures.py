#!/usr/bin/env python3
"""Writes the hwloc XML fixtures of tests/unit/topology_test.cpp.

p5.xml: an AWS p5.48xlarge as docs/p5-facts.md describes it: 2 packages, each one NUMA
node with 48 cores and 4 host bridges; under each, a root port leads to a PCIe switch whose
downstream ports 01.0-01.3 hold 4 EFA NICs, 01.4 the H100 and 01.5 an NVMe drive.

odd.xml: 1 NUMA node, 8 cores; GPU 0 shares a switch with 2 NICs, GPU 1's switch has no
NIC, and one NIC hangs directly off a host bridge (on no switch).

Run: python3 tests/data/make_topology_fixtures.py tests/data
"""
import sys

gp = [0]


def gpi():
    gp[0] += 1
    return gp[0]


def bitmap(bits):
    """hwloc's bitmap text: 32-bit words, most significant first."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if value == 0:
            break
    return ",".join("0x%08x" % w for w in reversed(words))


def sets(cpus, nodes):
    c, n = bitmap(cpus), bitmap(nodes)
    return f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"'


def pcidev(busid, kind):
    types = {"nic": "0200 [1d0f:efa1] [1d0f:efa1] 00", "gpu": "0302 [10de:2330] [10de:16c1] a1",
             "nvme": "0108 [1d0f:cd01] [1d0f:cd01] 00"}
    return f'<object type="PCIDev" gp_index="{gpi()}" pci_busid="0000:{busid}" pci_type="{types[kind]}" pci_link_speed="0.000000"/>'


def bridge(busid, sec, sub, depth, children):
    head = (f'<object type="Bridge" gp_index="{gpi()}" bridge_type="1-1" depth="{depth}" '
            f'bridge_pci="0000:[{sec:02x}-{sub:02x}]" pci_busid="0000:{busid}" '
            f'pci_type="0604 [1d0f:0200] [0000:0000] 00" pci_link_speed="0.000000">')
    return [head] + ["  " + line for c in children for line in c] + ["</object>"]


def host_bridge(sec, sub, children):
    head = (f'<object type="Bridge" gp_index="{gpi()}" bridge_type="0-1" depth="0" '
            f'bridge_pci="0000:[{sec:02x}-{sub:02x}]">')
    return [head] + ["  " + line for c in children for line in c] + ["</object>"]


def switch_with(root, gpu_bus, nic_buses, nvme=True):
    """Root port root:01.0 -> switch upstream port (root+1):00.0 -> downstream ports on
    bus root+2: 01.0-01.3 NICs, 01.4 GPU, 01.5 NVMe."""
    sw = root + 2
    last = gpu_bus + (1 if nvme else 0)
    ports = []
    for k, bus in enumerate(nic_buses):
        ports.append(bridge(f"{sw:02x}:01.{k}", bus, bus, 3, [[pcidev(f"{bus:02x}:00.0", "nic")]]))
    ports.append(bridge(f"{sw:02x}:01.4", gpu_bus, gpu_bus, 3, [[pcidev(f"{gpu_bus:02x}:00.0", "gpu")]]))
    if nvme:
        ports.append(bridge(f"{sw:02x}:01.5", gpu_bus + 1, gpu_bus + 1, 3,
                            [[pcidev(f"{gpu_bus + 1:02x}:00.0", "nvme")]]))
    upstream = bridge(f"{root + 1:02x}:00.0", sw, last, 2, ports)
    port = bridge(f"{root:02x}:01.0", root + 1, last, 1, [upstream])
    return host_bridge(root, last, [port])


def cores(first, count, node):
    lines = []
    for c in range(first, first + count):
        lines.append(f'<object type="Core" os_index="{c}" {sets([c], [node])} gp_index="{gpi()}">')
        lines.append(f'  <object type="PU" os_index="{c}" {sets([c], [node])} gp_index="{gpi()}"/>')
        lines.append("</object>")
    return lines


def package(os_index, node, cpus, io):
    lines = [f'<object type="Package" os_index="{os_index}" {sets(cpus, [node])} gp_index="{gpi()}">',
             f'  <object type="NUMANode" os_index="{node}" {sets(cpus, [node])} gp_index="{gpi()}" local_memory="1099511627776"/>']
    lines += ["  " + line for line in cores(cpus[0], len(cpus), node)]
    lines += ["  " + line for block in io for line in block]
    return lines + ["</object>"]


def machine(packages, cpus, nodes):
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
             '<topology version="2.0">',
             f'  <object type="Machine" os_index="0" {sets(cpus, nodes)} gp_index="{gpi()}">']
    lines += ["    " + line for p in packages for line in p]
    return "\n".join(lines + ["  </object>", "</topology>", ""])


def p5():
    gp[0] = 0
    # (root bus, GPU bus, first NIC bus) per GPU, from docs/p5-facts.md
    gpus = [(0x44, 0x53, 0x4f), (0x55, 0x64, 0x60), (0x66, 0x75, 0x71), (0x77, 0x86, 0x82),
            (0x88, 0x97, 0x93), (0x99, 0xa8, 0xa4), (0xaa, 0xb9, 0xb5), (0xbb, 0xca, 0xc6)]
    packages = []
    for node in range(2):
        io = [switch_with(root, gpu, [nic + k for k in range(4)])
              for root, gpu, nic in gpus[4 * node:4 * node + 4]]
        packages.append(package(node, node, list(range(48 * node, 48 * node + 48)), io))
    return machine(packages, list(range(96)), [0, 1])


def odd():
    gp[0] = 0
    io = [switch_with(0x10, 0x15, [0x13, 0x14]),        # GPU 15:00.0 with NICs 13:00.0, 14:00.0
          switch_with(0x20, 0x24, [], nvme=True),       # GPU 24:00.0, no NIC under its switch
          host_bridge(0x30, 0x30, [[pcidev("30:00.0", "nic")]])]  # a NIC on no switch
    return machine([package(0, 0, list(range(8)), io)], list(range(8)), [0])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, text in (("p5.xml", p5()), ("odd.xml", odd())):
        with open(f"{out}/{name}", "w") as f:
            f.write(text)
