#!/usr/bin/env bash
# A one-node Ceph cluster with an S3 gateway, for the S3 tests' second target:
# one monitor, one OSD on memstore (in memory: nothing on disk but the monitor's
# small store), radosgw on a free loopback port, a user and the bucket `casfs`.
# Needs Debian's ceph-mon, ceph-osd and radosgw (apt-get install radosgw ceph-mon ceph-osd).
#
#   scripts/rgw.sh start DIR     start it in DIR (created); prints the settings, e.g.
#                                  eval "$(scripts/rgw.sh start /tmp/rgw)"
#   scripts/rgw.sh stop DIR      stop every daemon started in DIR (by its pid file)
#
# The conformance suite against it:
#   eval "$(scripts/rgw.sh start /tmp/rgw)"
#   CASFS_TEST_S3=1 pytest tests/conformance tests/s3
#   scripts/rgw.sh stop /tmp/rgw
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[[ -n $cmd && -n $dir ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

KEY=casfs-rgw
SECRET=casfs-rgw-secret-key
BUCKET=casfs

stop() {
    for pidfile in "$dir"/run/*.pid; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            echo "rgw.sh: $what not ready; logs in $dir/log" >&2
            [[ -n ${KEEP:-} ]] || stop
            exit 1
        fi
        sleep 0.2
    done
}

case $cmd in
stop)
    stop
    exit 0
    ;;
start) ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac

mkdir -p "$dir"
dir=$(realpath "$dir")
stop
rm -rf "${dir:?}"/{mon,osd,rgw,run,log,ceph.conf,monmap}
mkdir -p "$dir"/{mon,osd,rgw,run,log}
mon_port=$(free_port)
rgw_port=$(free_port)
fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
conf=$dir/ceph.conf
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$mon_port
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
mon max pg per osd = 1000
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 2147483648
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
EOF

monmaptool --create --clobber --fsid "$fsid" --addv a "v1:127.0.0.1:$mon_port" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >/dev/null
ceph-mon -c "$conf" -i a
wait_for 30 "ceph-mon" ceph -c "$conf" --connect-timeout 2 mon stat

# (memstore's mkfs picks the OSD's uuid itself: register the one it wrote)
ceph-osd -c "$conf" -i 0 --mkfs >/dev/null 2>&1
ceph -c "$conf" osd new "$(cat "$dir/osd/fsid")" >/dev/null
ceph-osd -c "$conf" -i 0 2>>"$dir/log/osd.0.stderr"
wait_for 60 "ceph-osd" bash -c "ceph -c '$conf' osd stat | grep -q '1 up'"

radosgw -c "$conf" -n client.rgw 2>>"$dir/log/rgw.stderr"
wait_for 60 "radosgw" curl -sf -o /dev/null "http://127.0.0.1:$rgw_port/"
radosgw-admin -c "$conf" user create --uid casfs --display-name casfs \
    --access-key "$KEY" --secret-key "$SECRET" >/dev/null
wait_for 60 "bucket $BUCKET" python3 - "http://127.0.0.1:$rgw_port" "$BUCKET" "$KEY" "$SECRET" <<'PY'
# PUT /BUCKET, signed with AWS SigV4 (the stdlib has no S3 client; curl's signing is refused).
import datetime, hashlib, hmac, sys, urllib.request
endpoint, bucket, key, secret = sys.argv[1:]
host = endpoint.split("//", 1)[1]
now = datetime.datetime.now(datetime.timezone.utc)
stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
empty = hashlib.sha256(b"").hexdigest()
headers = {"host": host, "x-amz-content-sha256": empty, "x-amz-date": stamp}
signed = ";".join(sorted(headers))
canonical = "\n".join(["PUT", f"/{bucket}", "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, empty])
scope = f"{day}/us-east-1/s3/aws4_request"
to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
k = f"AWS4{secret}".encode()
for part in (day, "us-east-1", "s3", "aws4_request"):
    k = hmac.new(k, part.encode(), hashlib.sha256).digest()
sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
auth = f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, Signature={sig}"
req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT", headers={**headers, "Authorization": auth})
urllib.request.urlopen(req, timeout=5)
PY

cat <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port
export AWS_ACCESS_KEY_ID=$KEY
export AWS_SECRET_ACCESS_KEY=$SECRET
export AWS_REGION=us-east-1
EOF
