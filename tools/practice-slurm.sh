#!/usr/bin/env bash
# A practice Slurm cluster of two compute nodes on one Linux machine, to try `make slurm-check` before a real one.
#
#   sudo tools/practice-slurm.sh up      # install nothing; start munge, slurmctld and two slurmd
#   make slurm-check SLURM_CHECK_ARGS="--scheduler-interface slurmbr0"
#   sudo tools/practice-slurm.sh down    # stop them and remove the namespaces and the bridge
#
# Needs root and Debian's packages slurmctld, slurmd, slurm-client, munge and iproute2 (`make slurm` installs them).
#
# What makes the two nodes apart, and what does not:
# - each slurmd runs in a network namespace of its own (node1 10.77.0.11, node2 10.77.0.12), joined by veth pairs
#   to a bridge (slurmbr0, 10.77.0.1) where slurmctld and the grader's Dask scheduler listen: the workers reach the
#   scheduler over that network, not over loopback, and the scheduler reaches each worker at its node's address;
# - each has a host name of its own (a UTS namespace), and a /tmp and a build/slurm-check of its own (a mount
#   namespace with a tmpfs over each; a checkout that lies under /tmp is bound back into the node's /tmp) where only
#   logs/, the check's job logs, is the machine's own folder: a worker
#   cannot read the grader's work folder of the check (build/slurm-check/work), so every file a job needs must travel
#   with it, while the logs are shared, as on a cluster whose home folders are (after `make clean`, run down and up);
# - each node offers Slurm one CPU, so two one-core jobs land one on each node;
# - they share this machine's kernel, processors, memory and the rest of its file system (the checkout and its
#   .venv included, as a cluster's shared home would); GPUs are not declared.
# It writes /etc/slurm/slurm.conf (only if absent or written by this script) and keeps its state under
# /var/spool/practice-slurm and its logs under /var/log/practice-slurm.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONF=/etc/slurm/slurm.conf
MARK="# written by tools/practice-slurm.sh"
STATE=/var/spool/practice-slurm
LOGS=/var/log/practice-slurm
BRIDGE=slurmbr0
NODES=(node1 node2)
CHECK=$ROOT/build/slurm-check  # slurm-check's folder: the nodes see its logs/, not its work/

need_root() {
    if [ "$(id -u)" != 0 ]; then echo "practice-slurm: run it as root (sudo)" >&2; exit 2; fi
    for tool in slurmctld slurmd munged munge ip unshare nsenter; do
        command -v "$tool" >/dev/null || { echo "practice-slurm: $tool not found: make slurm (or apt-get install slurmctld slurmd slurm-client munge iproute2)" >&2; exit 2; }
    done
}

write_conf() {
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        echo "practice-slurm: $CONF exists and was not written here; leaving it (and stopping)" >&2
        exit 2
    fi
    local memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))  # MiB a node offers: a quarter each
    mkdir -p "$STATE/ctld" "$LOGS" /etc/slurm
    cat > "$CONF" <<EOF
$MARK
ClusterName=practice
SlurmctldHost=$(hostname -s)(10.77.0.1)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/%n
SlurmctldPidFile=/run/practice-slurmctld.pid
SlurmdPidFile=/run/practice-slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
NodeName=node1 NodeAddr=10.77.0.11 NodeHostname=node1 CPUs=1 RealMemory=$memory State=UNKNOWN
NodeName=node2 NodeAddr=10.77.0.12 NodeHostname=node2 CPUs=1 RealMemory=$memory State=UNKNOWN
PartitionName=normal Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
}

network() {
    ip link show "$BRIDGE" >/dev/null 2>&1 || {
        ip link add "$BRIDGE" type bridge
        ip addr add 10.77.0.1/24 dev "$BRIDGE"
    }
    ip link set "$BRIDGE" up
    local i=1
    for node in "${NODES[@]}"; do
        if ! ip netns list | grep -qw "practice-$node"; then
            ip link delete "veth-$node" 2>/dev/null || true  # left by a namespace just deleted
            ip netns add "practice-$node"
            ip link add "veth-$node" type veth peer name eth0 netns "practice-$node"
            ip link set "veth-$node" master "$BRIDGE" up
            ip -n "practice-$node" addr add "10.77.0.1$i/24" dev eth0
            ip -n "practice-$node" link set lo up
            ip -n "practice-$node" link set eth0 up
            ip -n "practice-$node" route add default via 10.77.0.1  # a route out, so Dask finds the node's address
        fi
        i=$((i + 1))
    done
}

start() {
    munge -n >/dev/null 2>&1 || { mkdir -p /run/munge && chown munge:munge /run/munge && runuser -u munge -- munged; }
    pgrep -f "slurmctld -f $CONF" >/dev/null || slurmctld -f "$CONF"
    mkdir -p "$CHECK/logs"
    chown "$(stat -c %u:%g "$ROOT")" "$ROOT/build" "$CHECK" "$CHECK/logs"  # the checkout's owner submits the jobs
    for node in "${NODES[@]}"; do
        pgrep -f "slurmd -f $CONF -N $node" >/dev/null && continue
        mkdir -p "$STATE/$node"
        # nsenter, not ip netns exec, which mounts a new /sys and so hides the cgroups slurmd and the sandbox use.
        nsenter --net="/run/netns/practice-$node" unshare --uts --mount --propagation private \
            "$ROOT/tools/practice-slurm.sh" node "$node"
    done
    for _ in $(seq 30); do
        if [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -cx idle)" = "${#NODES[@]}" ]; then
            sinfo -N
            return 0
        fi
        sleep 1
    done
    echo "practice-slurm: the nodes did not become idle in 30 s; sinfo says:" >&2
    sinfo -N >&2 || true
    echo "logs: $LOGS" >&2
    exit 1
}

node() {  # inside a node's own namespaces (start): its host name, /tmp and build/slurm-check, then its slurmd
    local node=$1
    local hold="$STATE/$node-checkout"
    hostname "$node"
    mkdir -p "$hold"
    mount --bind "$ROOT" "$hold"  # the checkout, kept through the node's own /tmp when it lies under /tmp
    mount -t tmpfs tmpfs /tmp
    case "$ROOT/" in
        /tmp/*) mkdir -p "$ROOT" && mount --move "$hold" "$ROOT" ;;
        *) umount "$hold" ;;
    esac
    mount --bind "$CHECK/logs" /mnt  # the check's logs, bound back in over the node's own build/slurm-check
    mount -t tmpfs tmpfs "$CHECK"
    mkdir "$CHECK/logs"
    mount --move /mnt "$CHECK/logs"
    exec slurmd -f "$CONF" -N "$node"  # it forks itself into the background
}

down() {
    for node in "${NODES[@]}"; do
        pkill -f "slurmd -f $CONF -N $node" || true
    done
    pkill -f "slurmctld -f $CONF" || true
    for _ in $(seq 20); do  # until they have saved their state and let go of their ports
        pgrep -f "slurm(ctld|d) -f $CONF" >/dev/null || break
        sleep 0.5
    done
    for node in "${NODES[@]}"; do
        # What is left in the node: a slurmd that did not end, the slurmstepd of a job still completing (it would
        # go on retrying the controller, and the next `up` find the node busy), the job's own processes.
        ip netns pids "practice-$node" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip link delete "veth-$node" 2>/dev/null || true
        ip netns delete "practice-$node" 2>/dev/null || true
    done
    ip link delete "$BRIDGE" 2>/dev/null || true
    echo "practice-slurm: stopped (munged left running; $CONF left in place)"
}

case "${1:-}" in
    up) need_root; write_conf; network; start ;;
    down) need_root; down ;;
    node) node "$2" ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
