#!/usr/bin/python3
"""docs/kubernetes/p5.yaml against what the Kubernetes API server and the device plugins
demand of it (there is no cluster here: these are the rules they apply, checked one by one):

- huge pages beside a cpu or memory request (the API server refuses hugepages alone), and
  equal requests and limits for huge pages and for extended resources (they cannot be
  overcommitted); Guaranteed QoS (cpu and memory requests equal to limits, whole CPUs), which
  a kubelet with the static CPU manager policy (not EKS's default) needs to give the data
  threads cores of their own;
- a whole p5 per pod: nvidia.com/gpu 8, vpc.amazonaws.com/efa 32, on two nodes;
- IPC_LOCK (registering memory pins it), a HugePages volume;
- the address exchange by TCP (--oob-port): the server gives it on a port, a headless Service
  (clusterIP None, published before the pod is ready) selects the server pod and names that
  port, and the client asks the Service's name for it; no shared volume, no file;
  --memory cuda on both (a pod that was given no GPU must fail, not move host memory);
- an image recipe beside it (Containerfile): a CUDA base, the EFA installer with --skip-kmod,
  the build against /opt/amazon/efa.
Prints each check; exit 1 on the first that fails. Usage: kubernetes_test.py SOURCE_DIR
"""
import re
import sys

try:
    import yaml
except ImportError:  # scripts/install-deps installs it; without it, skipped (77), not failed
    print("skipped: no Python module yaml (python3-yaml: scripts/install-deps)")
    sys.exit(77)

path = sys.argv[1] + "/docs/kubernetes/p5.yaml"
docs = [d for d in yaml.safe_load_all(open(path)) if d]
failed = False


def check(ok, what):
    global failed
    print(("ok      " if ok else "FAILED  ") + what)
    failed = failed or not ok


def quantity_gib(q):
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    return int(m.group(1)) * units.get(m.group(2), 2**-30) if m else None


services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
check(set(pods) == {"p5-server", "p5-client"}, "two pods: p5-server and p5-client")
check(not [d for d in docs if d["kind"] == "PersistentVolumeClaim"], "no volume claim: no shared file system")
check(len(services) == 1, f"one Service ({list(services)})")
(service_name, service), = services.items() if len(services) == 1 else [(None, {"spec": {}})]
sspec = service["spec"]
check(sspec.get("clusterIP") == "None" and sspec.get("publishNotReadyAddresses") is True,
      f"{service_name}: headless, its name resolving before the server pod is ready")
oob_ports = [p.get("port") for p in sspec.get("ports", [])]
server_labels = pods.get("p5-server", {}).get("metadata", {}).get("labels", {})
check(sspec.get("selector") and all(server_labels.get(k) == v for k, v in sspec["selector"].items())
      and not all(pods["p5-client"]["metadata"]["labels"].get(k) == v
                  for k, v in sspec["selector"].items()),
      f"{service_name}: selects the server pod only")
for name, pod in pods.items():
    spec = pod["spec"]
    labels = pod["metadata"].get("labels", {})
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    rules = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    check(any(r.get("topologyKey") == "kubernetes.io/hostname" for r in rules),
          f"{name}: required anti-affinity by hostname (the pods on two nodes)")
    (c,) = spec["containers"]
    req, lim = c["resources"].get("requests", {}), c["resources"].get("limits", {})
    check("hugepages-2Mi" in lim and ("memory" in req or "cpu" in req),
          f"{name}: hugepages-2Mi with a memory or cpu request (the API server's rule)")
    for r in ("hugepages-2Mi", "nvidia.com/gpu", "vpc.amazonaws.com/efa"):
        check(r in req and str(req[r]) == str(lim.get(r)),
              f"{name}: {r} requested equal to its limit ({req.get(r)} = {lim.get(r)})")
    check(str(req.get("cpu")) == str(lim.get("cpu")) and re.fullmatch(r"\d+", str(req.get("cpu")))
          and str(req.get("memory")) == str(lim.get("memory")),
          f"{name}: Guaranteed QoS, whole CPUs ({req.get('cpu')}): cores of its own")
    check(quantity_gib(lim.get("memory")) and quantity_gib(lim.get("hugepages-2Mi"))
          and quantity_gib(lim["memory"]) > quantity_gib(lim["hugepages-2Mi"]),
          f"{name}: memory limit above the huge pages")
    check(int(lim.get("nvidia.com/gpu", 0)) == 8, f"{name}: 8 GPUs (a whole p5)")
    check(int(lim.get("vpc.amazonaws.com/efa", 0)) == 32, f"{name}: 32 EFA devices")
    caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
    check("IPC_LOCK" in caps, f"{name}: IPC_LOCK")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    check(vols.get(mounts.get("/dev/hugepages"), {}).get("emptyDir", {}).get("medium") == "HugePages",
          f"{name}: a HugePages volume")
    check(set(vols) == {mounts.get("/dev/hugepages")}, f"{name}: no volume but the huge pages")
    script = " ".join(c.get("command", []) + c.get("args", []))
    check("--memory cuda" in script, f"{name}: --memory cuda (no GPU: fail, not host memory)")
    check(c.get("image") and "REPLACE-WITH-YOUR-IMAGE" in c["image"],
          f"{name}: the image is left for the user to name")
    if name == "p5-server":
        m = re.search(r"--oob-port (\d+)", script)
        check(m is not None and int(m.group(1)) in oob_ports,
              f"{name}: gives its address on the Service's port ({oob_ports})")
        check("--exit-after 28" in script,
              f"{name}: serves the ladder's 28 sessions (a calibration, 9 rungs of 3 runs)")
    else:
        check(re.search(r"--oob-port (\d+) (\S+)", script) is not None
              and re.search(r"--oob-port (\d+) (\S+)", script).groups()
              == (str(oob_ports[0] if oob_ports else ""), service_name),
              f"{name}: takes the address from the Service's name and port")
        check(script.rstrip().endswith("--ladder"), f"{name}: runs the ladder")
        check("--timeout" in script, f"{name}: --timeout given (the ladder's waits)")
        (init,) = spec.get("initContainers", [{}])
        wait = " ".join(init.get("args", []))
        m = re.search(r"timeout (\d+) .*?/dev/tcp/(\S+)/(\d+)", wait)
        check(m is not None and m.group(2) == service_name and int(m.group(3)) in oob_ports
              and 600 <= int(m.group(1)) < spec.get("activeDeadlineSeconds", 0),
              f"{name}: waits for the server's port, bounded, longer than a cold image pull")
    check(0 < spec.get("activeDeadlineSeconds", 0) <= 86400,
          f"{name}: activeDeadlineSeconds (no pod waits for ever)")

image = open(sys.argv[1] + "/docs/kubernetes/Containerfile").read()
check(re.search(r"^FROM .*nvidia/cuda|^ARG CUDA_IMAGE=nvidia/cuda:", image, re.M) is not None,
      "Containerfile: a CUDA base image")
check("efa_installer.sh" in image and "--skip-kmod" in image,
      "Containerfile: the EFA installer's user space (--skip-kmod)")
check("LIBFABRIC=/opt/amazon/efa scripts/build" in image,
      "Containerfile: the build against the EFA installer's libfabric")

# The two containers' own scripts, run here as the pods would run them (BUILD_DIR given:
# the build to run; the Service's name is this host, its port one that is free here; shm
# between them and host memory, as this host has no EFA and no GPU; the client started
# first, so it must wait for the server).
if len(sys.argv) > 2 and not failed:
    import os, socket, subprocess, time
    build = sys.argv[2]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = str(free.getsockname()[1])
    free.close()

    def script(pod):
        c = pods[pod]["spec"]["containers"][0]
        text = " ".join(c["args"]).replace(f"--oob-port {oob_ports[0]}", f"--oob-port {port}")
        for init in pods[pod]["spec"].get("initContainers", []):  # its init container first
            text = " ".join(init["args"]) + " && " + text
        text = text.replace(f"/dev/tcp/{service_name}/{oob_ports[0]}", f"/dev/tcp/127.0.0.1/{port}")
        text = text.replace(f" {service_name} ", " 127.0.0.1 ")
        text = text.replace("build-libfabric-*/07_full_p5/07_full_p5", build + "/07_full_p5/07_full_p5 -p shm")
        return text.replace("--memory cuda", "--memory host")
    client = subprocess.Popen(["/bin/bash", "-c", script("p5-client") + " -S 16k --pages 64 --min-seconds 0.1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1)
    server = subprocess.Popen(["/bin/bash", "-c", script("p5-server")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = client.communicate(timeout=300)
    served, _ = server.communicate(timeout=60)
    print(out[-1500:])
    check(client.returncode == 0 and out.count("| +") == 8,
          "the pods' scripts: the client waited for the server's address and ran every rung")
    check(server.returncode == 0 and "served 28 clients" in served,
          "the server served the ladder's 28 sessions")
sys.exit(1 if failed else 0)
