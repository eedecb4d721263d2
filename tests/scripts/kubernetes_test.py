#!/usr/bin/python3
"""docs/kubernetes/p5.yaml against what the Kubernetes API server and the device plugins
demand of it (there is no cluster here: these are the rules they apply, checked one by one):

- huge pages beside a cpu or memory request (the API server refuses hugepages alone), and
  equal requests and limits for huge pages and for extended resources (they cannot be
  overcommitted); Guaranteed QoS (cpu and memory requests equal to limits, whole CPUs), which
  the kubelet's static CPU manager needs to give the data threads cores of their own;
- a whole p5 per pod: nvidia.com/gpu 8, vpc.amazonaws.com/efa 32, on two nodes;
- IPC_LOCK (registering memory pins it), a HugePages volume;
- the address exchange: a ReadWriteMany claim mounted by both pods, a file named after the
  pods' shared `run` label, removed by the server before it writes it, waited for by the client
  in bounded time and checked to be hex; --memory cuda on both (a pod that was given no GPU
  must fail, not move host memory).
Prints each check; exit 1 on the first that fails. Usage: kubernetes_test.py SOURCE_DIR
"""
import re
import sys

import yaml

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


claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
check(set(pods) == {"p5-server", "p5-client"}, "two pods: p5-server and p5-client")
runs = set()
for name, pod in pods.items():
    spec = pod["spec"]
    labels = pod["metadata"].get("labels", {})
    runs.add(labels.get("run"))
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
    shared = vols.get(mounts.get("/shared"), {}).get("persistentVolumeClaim", {}).get("claimName")
    check(shared in claims and "ReadWriteMany" in claims[shared]["spec"]["accessModes"],
          f"{name}: /shared is a ReadWriteMany claim ({shared})")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("RUN", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.labels['run']", f"{name}: RUN from the pod's run label")
    script = " ".join(c.get("command", []) + c.get("args", []))
    check("--memory cuda" in script, f"{name}: --memory cuda (no GPU: fail, not host memory)")
    check(c.get("image") and "REPLACE-WITH-YOUR-IMAGE" in c["image"],
          f"{name}: the image is left for the user to name")
    if name == "p5-server":
        check(re.search(r"rm -f /shared/p5-\$RUN\.addr.*--address-file /shared/p5-\$RUN\.addr", script)
              is not None, f"{name}: removes then writes /shared/p5-$RUN.addr")
        check("--exit-after 9" in script, f"{name}: serves the ladder's 9 sessions")
    else:
        check(re.search(r"seq \d+\).*grep -qsE '\^\[0-9a-f\]\+\$' /shared/p5-\$RUN\.addr", script)
              is not None and "exit 1" in script,
              f"{name}: waits for a hex address, bounded, and fails saying so")
        check("$(cat /shared/p5-$RUN.addr) --ladder" in script, f"{name}: runs the ladder")
check(len(runs) == 1 and None not in runs, f"both pods share one run label ({runs})")

# The two containers' own scripts, run here as the pods would run them (BUILD_DIR given:
# the build to run; the shared volume a folder; shm between them and host memory, as this
# host has no EFA and no GPU; the client started first, so it must wait for the address).
if len(sys.argv) > 2 and not failed:
    import os, subprocess, tempfile
    build = sys.argv[2]
    with tempfile.TemporaryDirectory() as shared:
        def script(pod):
            c = pods[pod]["spec"]["containers"][0]
            text = " ".join(c["args"]).replace("/shared", shared)
            text = text.replace("build-libfabric-*/07_full_p5/07_full_p5", build + "/07_full_p5/07_full_p5 -p shm")
            return text.replace("--memory cuda", "--memory host")
        env = dict(os.environ, RUN="1")
        open(shared + "/p5-1.addr", "w").write("stale, not hex\n")  # an older run's leftover
        client = subprocess.Popen(["/bin/bash", "-c", script("p5-client") + " -S 16k --pages 64"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        server = subprocess.Popen(["/bin/bash", "-c", script("p5-server")], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = client.communicate(timeout=300)
        served, _ = server.communicate(timeout=60)
        print(out[-1500:])
        check(client.returncode == 0 and out.count("| +") == 8,
              "the pods' scripts: the client waited for the server's address and ran every rung")
        check(server.returncode == 0 and "served 9 clients" in served, "the server served the 9 rungs")
sys.exit(1 if failed else 0)
