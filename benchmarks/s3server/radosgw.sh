#!/usr/bin/env bash
# A real S3 server for benchmarks: Ceph's RADOS Gateway (radosgw) from Debian's
# packages, on a throwaway one-monitor, one-OSD Ceph cluster, on 127.0.0.1 only.
#
#   radosgw.sh install        apt-get the Ceph packages (skipped when present)
#   radosgw.sh start  [DIR]   make the cluster + radosgw under DIR, print JSON
#   radosgw.sh stop   [DIR]   kill the daemons (by pid files), remove DIR
#   radosgw.sh status [DIR]   say which daemons run, and the cluster's health
#                             (exit 0 when all three run, 3 otherwise)
#
# DIR defaults to $RADOSGW_DIR, else /tmp/shardstream-radosgw. `start` prints
# on its last line of stdout a JSON object with endpoint_url,
# aws_access_key_id, aws_secret_access_key, region and dir; everything else
# goes to stderr. The S3 port is $S3_PORT, else a free one. `start` exits 4
# when DIR already has a running cluster, 1 on any other failure (after
# stopping what it started, also on SIGINT/SIGTERM; DIR is kept for its logs).
#
# Why a whole cluster: Debian bookworm ships Ceph 16.2 (Pacific), whose
# radosgw has no standalone backend (no "dbstore"), so it needs RADOS: one
# monitor and one BlueStore OSD on a sparse file. No manager daemon is run:
# radosgw and pool creation do not need one, and it would cost memory.
set -euo pipefail

readonly DEFAULT_DIR=${RADOSGW_DIR:-/tmp/shardstream-radosgw}
readonly PACKAGES=(ceph-mon ceph-osd radosgw ceph-common)
# Fixed credentials: the server is throwaway and bound to loopback only.
readonly ACCESS_KEY=shardstreambench
readonly SECRET_KEY=shardstreambenchsecret0123456789
readonly REGION=us-east-1
readonly S3_USER=bench
# Seconds to wait for each daemon to come up before giving up.
readonly TIMEOUT=${RADOSGW_TIMEOUT:-120}
# Marker written by `start`: `stop` removes only a folder that has it, so a
# mistyped DIR (say, /) is never wiped.
readonly MARKER=.shardstream-radosgw
# Exit status of `start` when DIR already has a running cluster.
readonly EXIT_ALREADY_RUNNING=4

# Messages go to fd 3, a copy of the original stderr, so that they are seen
# even from the EXIT trap when a signal lands inside a command whose stderr is
# sent to /dev/null (the polls in wait_for). spawn closes it for the daemons.
exec 3>&2
log() { printf 'radosgw.sh: %s\n' "$*" >&3; }
die() { printf 'radosgw.sh: error: %s\n' "$*" >&3; exit 1; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "$1 needs root (apt-get, and the daemons write under DIR as root)"
}

installed() {
    local p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || return 1
    done
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${PACKAGES[@]}" >&2
}

cmd_install() {
    if installed; then
        log "already installed: ${PACKAGES[*]} ($(ceph --version 2>/dev/null || true))"
        return 0
    fi
    need_root install
    log "installing ${PACKAGES[*]} (about 30 s) ..."
    # The package scripts try to enable systemd units; with no systemd running
    # they print "Failed to connect to bus" and go on, which is harmless: no
    # daemon is started by the packages.
    # Install from the package lists already there first: `apt-get update` can
    # fail where the install would not (lists kept compressed, repository
    # signatures that cannot be checked). Update only when that install fails,
    # and go on to a second install whatever the update says.
    if ! apt_install; then
        log "installing from the present package lists failed; apt-get update, then again"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
            log "apt-get update failed (going on: the install says what is missing)"
        apt_install || die "apt-get install ${PACKAGES[*]} failed"
    fi
    installed || die "apt-get finished but ${PACKAGES[*]} are not all installed"
    log "installed: $(ceph --version)"
}

# --- helpers for a running cluster -----------------------------------------

resolve_dir() {
    local d=${1:-$DEFAULT_DIR}
    [[ $d == /* ]] || d="$PWD/$d"
    printf '%s\n' "${d%/}"
}

# A free TCP port on 127.0.0.1, chosen by the kernel.
free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_free() {
    /usr/bin/python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

# pid of daemon NAME (mon, osd, rgw) if its pid file names a live process of
# that daemon; empty otherwise. Checking /proc/PID/cmdline guards against a
# stale pid file whose number was reused by an unrelated process.
daemon_pid() {
    local dir=$1 name=$2 pid
    [[ -f $dir/run/$name.pid ]] || return 0
    pid=$(<"$dir/run/$name.pid")
    pid_alive "$pid" || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$dir/ceph.conf" || return 0
    printf '%s\n' "$pid"
}

any_running() {
    local dir=$1 n
    for n in mon osd rgw; do
        [[ -n $(daemon_pid "$dir" "$n") ]] && return 0
    done
    return 1
}

# The ceph CLI waits for the monitor forever by default; bound every call.
ceph_cli() {
    timeout 60 ceph -c "$DIR/ceph.conf" --connect-timeout 30 "$@"
}

# Start a daemon in its own session (so a Ctrl-C aimed at the caller does not
# reach it), with stdin/stdout/stderr off the caller's pipes (else a caller
# reading `start`'s stdout would wait for the daemons to exit), and record its
# pid. -f keeps it in the foreground of that session, logging to log_file.
spawn() {
    local name=$1
    shift
    setsid "$@" -f </dev/null >>"$DIR/log/$name.out" 2>&1 3>&- &
    echo $! >"$DIR/run/$name.pid"
}

# fail_with NAME WHAT: the daemon NAME did not come up; point at its logs.
fail_with() {
    local name=$1 what=$2 logf
    logf=$(find "$DIR/log" -name "*$name*.log" 2>/dev/null | head -n 1 || true)
    log "$what"
    if [[ -n $logf ]]; then
        log "last lines of $logf:"
        tail -n 15 "$logf" >&3 || true
    fi
    log "daemon output: $DIR/log/$name.out; all logs: $DIR/log/"
    exit 1  # the EXIT trap set by cmd_start stops the daemons
}

# EXIT trap of `start`: whatever made it stop early (a failed step, set -e,
# SIGINT/SIGTERM), stop the daemons it had started, keeping DIR for the logs.
cleanup_failed_start() {
    trap - EXIT
    if any_running "$DIR"; then
        log "start did not finish; stopping what it started (logs kept in $DIR/log/; '$0 stop $DIR' removes them)"
        kill_daemons "$DIR" || true
    fi
}

# wait_for NAME DESCRIPTION COMMAND...: poll COMMAND until it succeeds, the
# daemon NAME dies, or TIMEOUT seconds pass.
wait_for() {
    local name=$1 what=$2 deadline=$((SECONDS + TIMEOUT))
    shift 2
    until "$@" >/dev/null 2>&1; do
        [[ -n $(daemon_pid "$DIR" "$name") ]] ||
            fail_with "$name" "the $name daemon exited while waiting for: $what"
        ((SECONDS < deadline)) ||
            fail_with "$name" "timed out after ${TIMEOUT}s waiting for: $what"
        sleep 1
    done
}

osd_up() {
    ceph_cli osd stat -f json | /usr/bin/python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["num_up_osds"] < 1)'
}

s3_answers() {
    # An anonymous GET / answers 200 (empty bucket list) once radosgw has
    # made its pools and serves requests.
    curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$S3_PORT_CHOSEN/"
}

write_conf() {
    local fsid=$1 mon_v2=$2 mon_v1=$3
    cat >"$DIR/ceph.conf" <<EOF
# Throwaway benchmark cluster made by benchmarks/s3server/radosgw.sh.
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$mon_v2,v1:127.0.0.1:$mon_v1]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv6 = false
# No cephx: nothing to authenticate on a loopback-only throwaway cluster.
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
# Without cephx the default "secure" messenger mode cannot be negotiated
# (radosgw fails to reach the monitor), so everything speaks crc.
ms_mon_client_mode = crc
ms_mon_cluster_mode = crc
ms_mon_service_mode = crc
ms_client_mode = crc
ms_cluster_mode = crc
ms_service_mode = crc
# All state, sockets, pids and logs under DIR, none in /var or /etc.
run_dir = $DIR/run
admin_socket = $DIR/run/\$cluster-\$name.asok
log_file = $DIR/log/\$cluster-\$name.log
log_to_stderr = false
err_to_stderr = true
mon_cluster_log_file = $DIR/log/\$cluster.log
crash_dir = $DIR/crash
keyring = $DIR/keyring
# One OSD: single-copy pools, no redundancy warnings, few PGs, no autoscaler
# (it is a manager module and there is no manager).
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
# Without cephx the global_id reclaim check is moot; silence its HEALTH_WARN.
mon_warn_on_insecure_global_id_reclaim_allowed = false
# The daemons share the client's cores here (real S3's CPU is not on the
# training box): no data checksums on loopback messages, no debug logging
# gathered in memory. Reported server CPU s/GB is what remains.
ms_crc_data = false
debug_ms = 0/0
debug_rgw = 0/0
debug_osd = 0/0
debug_bluestore = 0/0
debug_bluefs = 0/0
debug_bdev = 0/0
debug_rocksdb = 0/0
debug_objecter = 0/0
debug_rados = 0/0
debug_monc = 0/0

[mon]
mon_data = $DIR/mon/\$cluster-\$id
# The monitor stops itself when its disk is more than 95% full by default;
# a benchmark box may well be that full, and the data here is throwaway.
mon_data_avail_crit = 1
mon_data_avail_warn = 2
# A lone monitor needs no batching of map updates; the default 1 s interval
# makes every pool create wait about a second.
paxos_propose_interval = 0.1

[osd]
osd_data = $DIR/osd/\$cluster-\$id
osd_objectstore = bluestore
# BlueStore on a sparse 20 GiB file: it takes disk only for what is written.
bluestore_block_path = $DIR/osd/block
bluestore_block_create = true
bluestore_block_size = 21474836480
bluestore_block_db_create = false
bluestore_block_wal_create = false
# Keep memory small: the default target is 4 GiB; 1 GiB is about the least
# that BlueStore's autotuner still works with (osd_memory_base is 768 MiB).
osd_memory_target = 1073741824
osd_memory_cache_min = 67108864
# Lets the OSD place itself in CRUSH on start, so no crush commands needed.
osd_crush_update_on_start = true
# Block checksums cost OSD CPU on every write and read; this data is throwaway.
bluestore_csum_type = none

[client.rgw.bench]
rgw_frontends = beast endpoint=127.0.0.1:$S3_PORT_CHOSEN tcp_nodelay=1
# The default 512 threads is far more than a 2-core benchmark box uses.
rgw_thread_pool_size = 64
rgw_dns_name = 127.0.0.1
# No resharding/GC/lifecycle work competing with the benchmark.
rgw_dynamic_resharding = false
rgw_enable_lc_threads = false
rgw_init_timeout = $TIMEOUT
EOF
}

cmd_start() {
    need_root start
    DIR=$(resolve_dir "${1:-}")
    installed || die "Ceph packages missing; run '$0 install' first"
    if [[ -d $DIR ]]; then
        if any_running "$DIR"; then
            # Own exit status, so that a caller (server.py) knows not to stop
            # a cluster that is not its own.
            log "error: a cluster is already running in $DIR; '$0 stop $DIR' first (or use another DIR)"
            exit "$EXIT_ALREADY_RUNNING"
        fi
        # An empty folder (say, from mktemp -d) is fine; a leftover of a
        # crashed or killed run is cleared; anything else is not ours.
        if [[ -f $DIR/$MARKER ]]; then
            log "removing stale state in $DIR (no daemon of it is running)"
            rm -rf "$DIR"
        elif [[ -n $(ls -A "$DIR") ]]; then
            die "$DIR exists, is not empty and was not made by this script; pick another DIR"
        fi
    fi
    local t0=$SECONDS

    # Ports first, before anything is written. Kernel-chosen free ports are
    # not reserved, so one could in theory be taken before a daemon binds it;
    # that daemon then fails to start and the wait below reports it.
    S3_PORT_CHOSEN=${S3_PORT:-$(free_port)}
    port_free "$S3_PORT_CHOSEN" ||
        die "port $S3_PORT_CHOSEN on 127.0.0.1 is already in use (S3_PORT=${S3_PORT:-unset})"
    local fsid mon_v2 mon_v1
    mon_v2=$(free_port)
    while [[ $mon_v2 == "$S3_PORT_CHOSEN" ]]; do mon_v2=$(free_port); done
    mon_v1=$(free_port)
    while [[ $mon_v1 == "$S3_PORT_CHOSEN" || $mon_v1 == "$mon_v2" ]]; do mon_v1=$(free_port); done
    fsid=$(uuidgen)

    mkdir -p "$DIR"/{run,log,crash,mon,osd/ceph-0}
    touch "$DIR/$MARKER"
    trap cleanup_failed_start EXIT
    write_conf "$fsid" "$mon_v2" "$mon_v1"
    local conf=$DIR/ceph.conf

    # Monitor: a monmap with our one monitor, then mkfs. mkfs still wants a
    # keyring file even with auth none.
    log "creating the monitor (v2 port $mon_v2, v1 port $mon_v1)"
    ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_v2,v1:127.0.0.1:$mon_v1]" \
        "$DIR/monmap" >/dev/null || die "monmaptool failed"
    ceph-mon -c "$conf" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring" \
        >>"$DIR/log/mon.out" 2>&1 || die "ceph-mon --mkfs failed; see $DIR/log/mon.out"
    spawn mon ceph-mon -c "$conf" -i a
    wait_for mon "the monitor to answer" ceph_cli mon stat

    # OSD: register it, make its BlueStore (creates the sparse block file),
    # start it and wait until the monitor sees it up.
    log "creating the OSD (BlueStore on sparse file $DIR/osd/block)"
    local osd_uuid osd_id
    osd_uuid=$(uuidgen)
    osd_id=$(ceph_cli osd new "$osd_uuid") || die "'ceph osd new' failed; see $DIR/log/"
    [[ $osd_id == 0 ]] || die "expected OSD id 0, the monitor gave '$osd_id'"
    ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" \
        >>"$DIR/log/osd.out" 2>&1 || die "ceph-osd --mkfs failed; see $DIR/log/osd.out and $DIR/log/ceph-osd.0.log"
    spawn osd ceph-osd -c "$conf" -i 0
    wait_for osd "OSD 0 to be up" osd_up

    # radosgw makes its own pools, but the bucket pools only on the first
    # bucket / multipart upload, whose request then waits for the new PGs to
    # peer (a first 64 MiB PUT took 2 s instead of 0.4 s). Made here, they
    # peer while radosgw starts.
    local pool
    for pool in default.rgw.buckets.index default.rgw.buckets.data default.rgw.buckets.non-ec; do
        if ! ceph_cli osd pool create "$pool" >/dev/null 2>&1 ||
            ! ceph_cli osd pool application enable "$pool" rgw >/dev/null 2>&1; then
            fail_with mon "could not create pool $pool"
        fi
    done

    log "starting radosgw on 127.0.0.1:$S3_PORT_CHOSEN"
    spawn rgw radosgw -c "$conf" -n client.rgw.bench
    wait_for rgw "radosgw to answer on http://127.0.0.1:$S3_PORT_CHOSEN/" s3_answers

    log "creating S3 user '$S3_USER'"
    timeout 60 radosgw-admin -c "$conf" user create --uid="$S3_USER" --display-name="$S3_USER" \
        --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >>"$DIR/log/radosgw-admin.out" 2>&1 ||
        fail_with rgw "radosgw-admin user create failed (output: $DIR/log/radosgw-admin.out)"

    echo "$S3_PORT_CHOSEN" >"$DIR/s3_port"
    trap - EXIT
    log "up in $((SECONDS - t0)) s; logs in $DIR/log/; stop with: $0 stop $DIR"
    info_json
}

info_json() {
    printf '{"endpoint_url": "http://127.0.0.1:%s", "aws_access_key_id": "%s", "aws_secret_access_key": "%s", "region": "%s", "dir": "%s"}\n' \
        "$(<"$DIR/s3_port")" "$ACCESS_KEY" "$SECRET_KEY" "$REGION" "$DIR"
}

# Stop radosgw, then the OSD, then the monitor (clients before servers, so
# nothing waits on a vanished monitor). TERM first; KILL after 20 s.
kill_daemons() {
    local dir=$1 n pid deadline
    for n in rgw osd mon; do
        pid=$(daemon_pid "$dir" "$n")
        [[ -n $pid ]] || continue
        log "stopping $n (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 20))
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        if pid_alive "$pid"; then
            log "$n (pid $pid) ignored SIGTERM for 20 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
        fi
        pid_alive "$pid" && die "could not stop $n (pid $pid)"
    done
    return 0
}

cmd_stop() {
    DIR=$(resolve_dir "${1:-}")
    if [[ ! -d $DIR ]]; then
        log "nothing to stop: $DIR does not exist"
        return 0
    fi
    [[ -f $DIR/$MARKER ]] || die "$DIR was not made by this script; not touching it"
    kill_daemons "$DIR"
    rm -rf "$DIR"
    log "stopped; removed $DIR"
}

cmd_status() {
    DIR=$(resolve_dir "${1:-}")
    if [[ ! -f $DIR/$MARKER ]]; then
        echo "not running: no cluster in $DIR"
        return 3
    fi
    local n pid up=0 rss
    for n in mon osd rgw; do
        pid=$(daemon_pid "$DIR" "$n")
        if [[ -n $pid ]]; then
            rss=$(ps -o rss= -p "$pid" | tr -d ' ')
            echo "$n: running, pid $pid, RSS $((rss / 1024)) MiB"
            up=$((up + 1))
        else
            echo "$n: not running"
        fi
    done
    if [[ -n $(daemon_pid "$DIR" mon) ]]; then
        ceph_cli health 2>/dev/null | sed 's/^/health: /' || echo "health: monitor did not answer"
    fi
    if ((up == 3)) && [[ -f $DIR/s3_port ]]; then
        info_json
        return 0
    fi
    return 3
}

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

main() {
    local sub=${1:-}
    [[ $# -gt 0 ]] && shift
    case $sub in
    install) cmd_install ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    *) usage ;;
    esac
}

main "$@"
