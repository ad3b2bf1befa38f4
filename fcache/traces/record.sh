#!/usr/bin/env bash
# Records the running kernel's page sets for every trace here, several runs each, at the disk's
# own read_ahead_kb and at 128 KiB, into fcache/traces/recorded/ (what `cargo test -p fcache
# --test ra_diff` checks foliocache against). Needs root: the 128 KiB recording runs on an ext4
# image on a loop device whose read_ahead_kb is set to 128, so the machine's disk keeps its own
# setting. Each recording also prints the live comparison with foliocache.
#
#   fcache/traces/record.sh            # RUNS=5 DATA=/var/tmp/fcache-ra-diff
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
DATA=${DATA:-/var/tmp/fcache-ra-diff}
OUT=fcache/traces/recorded
mkdir -p "$OUT" "$DATA"

nice -n 10 cargo build --release -p fcache
FCACHE=target/release/fcache

echo "== the disk's own read_ahead_kb ($DATA)"
"$FCACHE" ra-diff --set fcache/traces "$DATA" --runs "$RUNS" --brief --record "$OUT/disk.json" | tail -2

echo "== 128 KiB, on a loop device"
IMG=$DATA/ra128.img
MNT=$DATA/ra128
LOOP=
cleanup() {
    mountpoint -q "$MNT" && umount "$MNT"
    [ -n "$LOOP" ] && losetup -d "$LOOP"
    rm -f "$IMG"
}
trap cleanup EXIT
rm -f "$IMG"
truncate -s 400M "$IMG"
mkfs.ext4 -q -F "$IMG"
LOOP=$(losetup --find --show --direct-io=on "$IMG")
mkdir -p "$MNT"
mount "$LOOP" "$MNT"
echo 128 > "/sys/block/$(basename "$LOOP")/queue/read_ahead_kb"
"$FCACHE" ra-diff --set fcache/traces "$MNT" --runs "$RUNS" --brief --record "$OUT/ra128.json" | tail -2
