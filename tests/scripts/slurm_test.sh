#!/usr/bin/env bash
# scripts/slurm-p5 on a real Slurm of one node: munged, slurmctld and slurmd started here
# (Debian's slurm-wlm and munge; scripts/install-deps --slurm), a node that says it has 8 GPUs
# (a gres without devices, so that the recipe's --gpus-per-node=8 is granted as on a p5),
# then the recipe submitted as a p5 user would, with what one host needs instead of two
# (one node, two tasks, one core each; shm between them; host memory: there is no GPU),
# and its output read: the server's and the client's lines, every page verified. Everything it
# started is stopped, and its files removed. Needs root; exit 77 (skipped) without Slurm.
#   tests/scripts/slurm_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1; build=$2
[ "$(id -u)" -eq 0 ] || { echo "slurm test skipped: needs root (munged, slurmctld, slurmd)"; exit 77; }
for tool in munged slurmctld slurmd sbatch sinfo; do
  command -v $tool >/dev/null || { echo "slurm test skipped: no $tool (scripts/install-deps --slurm)"; exit 77; }
done

work=$(mktemp -d /tmp/slurm-test-XXXXXX); chmod 755 "$work"
pids=()
cleanup() {
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet --full 2>/dev/null
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" 2>/dev/null
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" 2>/dev/null
  [ -f "$work/munge/munged.pid" ] && kill "$(cat "$work/munge/munged.pid")" 2>/dev/null
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log "$work"/munge/*.log "$work"/job.out; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done; exit 1; }

# munge: its own key and socket here, so nothing of the host's is touched.
mkdir -p "$work/munge" "$work/munge-socket"; chown munge:munge "$work/munge" "$work/munge-socket"
chmod 700 "$work/munge"; chmod 755 "$work/munge-socket"  # the key private, the socket for all
dd if=/dev/urandom of="$work/munge/munge.key" bs=128 count=1 status=none
chown munge:munge "$work/munge/munge.key"; chmod 400 "$work/munge/munge.key"
runuser -u munge -- munged --key-file="$work/munge/munge.key" --socket="$work/munge-socket/socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/seed" ||
  fail "munged did not start"

port=$(( 20000 + RANDOM % 20000 ))
mkdir -p "$work/state" "$work/spool"
cat >"$work/slurm.conf" <<EOF
ClusterName=rgjtest
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$work/munge-socket/socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
GresTypes=gpu
NodeName=rgjnode NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:8 State=UNKNOWN
PartitionName=test Nodes=rgjnode Default=YES MaxTime=INFINITE State=UP
EOF
# Eight stand-ins for /dev/nvidia0-7: Slurm counts a node's GPUs by their files.
mkdir -p "$work/dev"; for i in 0 1 2 3 4 5 6 7; do touch "$work/dev/nvidia$i"; done
cat >"$work/gres.conf" <<EOF
AutoDetect=off
NodeName=rgjnode Name=gpu File=$work/dev/nvidia[0-7]
EOF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" -N rgjnode || fail "slurmd did not start"
for _ in $(seq 60); do
  state=$(sinfo -h -n rgjnode -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || fail "the node never came up (state '$state')"
echo "slurm: node rgjnode $state, $(sinfo -h -o '%G' | head -1)"

# The recipe, as a user submits it, with what one host needs: one node, two tasks of one core,
# shm between them, host memory. --wait: sbatch returns with the job's exit code.
cd "$src" || exit 1
# A port nothing listens on, for the server's address (--oob-port).
oob_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
BUILD_DIR=$build MEMORY=host PROVIDER=shm OOB_PORT=$oob_port timeout 300 sbatch --wait -N1 --ntasks-per-node=2 \
  --cpus-per-task=1 -o "$work/job.out" scripts/slurm-p5 -S 64k --pages 256 --requests 2 --json
rc=$?
echo "== the job's output"; cat "$work/job.out"
[ $rc -eq 0 ] || fail "the job exited $rc"
grep -q "slurm-p5: server on " "$work/job.out" || fail "no server line"
grep -q "slurm-p5: client on " "$work/job.out" || fail "no client line"
grep -q '"verified_bytes":33554432' "$work/job.out" || fail "not every page verified (256 pages of 64 KiB, twice)"
grep -q "served 1 client" "$work/job.out" || fail "the server did not end after its client"
grep -q -- "--oob-port $oob_port 127.0.0.1 " "$work/job.out" || fail "the client did not ask the first node (NodeAddr)"

# The documented default, no client arguments: --ladder, a calibration and 3 runs per rung, and
# the server must stay for all of them (it once got --exit-after 1 and rung 2 found no server).
BUILD_DIR=$build MEMORY=host PROVIDER=shm OOB_PORT=$oob_port timeout 600 sbatch --wait -N1 --ntasks-per-node=2 \
  --cpus-per-task=1 -o "$work/default.out" scripts/slurm-p5
rc=$?
echo "== the default job's output"; cat "$work/default.out"
[ $rc -eq 0 ] || fail "the default job (--ladder) exited $rc"
grep -q "served 28 clients" "$work/default.out" || fail "the default job's server did not serve every run"
grep -q "| + one doorbell per 16 WRITEs (FI_MORE) | " "$work/default.out" || fail "the default job's ladder has no last rung"

# A recipe run outside sbatch says so; one whose build is missing says which.
out=$(bash scripts/slurm-p5 2>&1); [ $? -eq 2 ] && [[ "$out" == *"run it with sbatch"* ]] || fail "outside sbatch: '$out'"
echo "slurm-p5 ran under Slurm: two tasks, the address by --oob-port, every page verified"
