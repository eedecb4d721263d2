"""Every stage's --json output against docs/record.schema.json (Debian's python3-jsonschema):
stdout holds JSON records only; each client's record names its stage, provider, fabric and
request; each server's session record names the client and how it ended; 07's ladder prints
one record per rung.

    record_schema_test.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import jsonschema
except ImportError:  # scripts/install-deps installs it; without it, skipped (77), not failed
    print("skipped: no Python module jsonschema (python3-jsonschema: scripts/install-deps)")
    sys.exit(77)

source, build = sys.argv[1], sys.argv[2]
with open(os.path.join(source, "docs", "record.schema.json")) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
failures = []


def records_of(stdout, who):
    """The records on `stdout`, each validated; any other line is a failure."""
    records = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            failures.append(f"{who}: a line on stdout that is not JSON: {line!r}")
            continue
        for error in validator.iter_errors(record):
            failures.append(f"{who}: {error.message} at {list(error.path)}: {line}")
        records.append(record)
    return records


def run(stage, client_args, sessions):
    """A server with --json serving one client run with --json, over shm."""
    binary = os.path.join(build, stage, stage)
    with tempfile.TemporaryDirectory() as tmp:
        addr = os.path.join(tmp, "addr")
        server = subprocess.Popen(
            [binary, "-p", "shm", "--memory", "host", "--json", "--address-file", addr,
             "--exit-after", str(sessions)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (os.path.exists(addr) and os.path.getsize(addr)) and time.time() < deadline:
            time.sleep(0.05)
        with open(addr) as f:
            address = f.read().strip()
        client = subprocess.run(
            [binary, "-p", "shm", address, "--memory", "host", "--json", "--timeout", "60"] +
            client_args, capture_output=True, text=True, timeout=300)
        out, err = server.communicate(timeout=120)
    if client.returncode != 0 or server.returncode != 0:
        failures.append(f"{stage}: client exit {client.returncode}, server exit "
                        f"{server.returncode}: {client.stderr[-500:]} {err[-500:]}")
    return records_of(client.stdout, stage + " client"), records_of(out, stage + " server")


def expect(condition, what):
    if not condition:
        failures.append(what)


request = ["-S", "4k", "--pages", "16", "--requests", "2"]
for stage in ["04_concurrent", "05_queuing", "06_multi_nic", "07_full_p5"]:
    clients, sessions = run(stage, request, 1)
    expect(len(clients) == 1, f"{stage}: {len(clients)} client records, not 1")
    expect(len(sessions) == 1, f"{stage}: {len(sessions)} session records, not 1")
    for r in clients:
        expect((r["record"], r["stage"], r["provider"], r["fabric"]) ==
               ("client", stage, "shm", "shm"), f"{stage}: the client names {r}")
        expect((r["page_size"], r["pages"], r["requests"]) == (4096, 16, 2),
               f"{stage}: the request {r['page_size']} {r['pages']} {r['requests']}")
        expect(r["verified_bytes"] == 4096 * 16 * 2, f"{stage}: verified {r['verified_bytes']}")
        expect(r["link_gbps"] is None and r["percent_of_link"] is None,
               f"{stage}: shm's link rate is unknown, not {r['link_gbps']}")
    for r in sessions:
        expect((r["record"], r["stage"], r["client"], r["ended"]) ==
               ("session", stage, 1, "done"), f"{stage}: the session {r}")
        expect((r["engine"] is None) == (stage != "07_full_p5"), f"{stage}: engine {r['engine']}")
    print(f"{stage}: {len(clients)} client and {len(sessions)} session records, valid")

# 07's ladder: a record per rung, each naming it, with its runs' range and (past the first) a
# verdict; at the server a session per run and the calibration's.
clients, sessions = run("07_full_p5", request + ["--ladder", "--min-seconds", "0.05"], 28)
expect(len(clients) == 9 and all(r["step"] and r["runs"] == 3 for r in clients),
       f"07 --ladder: {[(r.get('step'), r.get('runs')) for r in clients]}")
expect(all((r["verdict"] is None) == (i == 0) and r["gbps_range"][0] <= r["gbps"] <= r["gbps_range"][1]
           for i, r in enumerate(clients)), f"07 --ladder: {[(r.get('gbps_range'), r.get('verdict')) for r in clients]}")
expect(len(sessions) == 28, f"07 --ladder: {len(sessions)} sessions at the server, not 28")
print(f"07_full_p5 --ladder: {len(clients)} rung records, {len(sessions)} sessions, valid")

# The schema refuses what it must: a figure written as -1 for unknown, a missing field.
bad = dict(clients[0]) if clients else {}
bad["first_write_seconds"] = -1
expect(not validator.is_valid(bad), "the schema took -1 for an unknown figure")
del bad["first_write_seconds"]
expect(not validator.is_valid(bad), "the schema took a record without first_write_seconds")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("every record is valid against docs/record.schema.json")
