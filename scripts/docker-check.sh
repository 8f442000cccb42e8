#!/usr/bin/env bash
# Builds the CPU image (docker/Dockerfile.cpu) with Debian's podman and runs it the way a
# user would with Docker: `partrain version`, the quick start, and one 2-rank job trained by
# two containers of one pod that share only loopback (two "hosts", one rank each).
#
#   scripts/docker-check.sh              all steps
#   scripts/docker-check.sh base build   only these steps (base, build, version, quickstart, pod)
#
# No registry is reachable from here, so the base image is made: `debootstrap --variant=minbase
# bookworm` from the mirror apt already uses, imported as docker.io/library/debian:bookworm so
# that an unchanged `FROM debian:bookworm` builds. Podman runs with runc, cgroupfs and bounded
# ulimits (the host's hard limits are lower than podman's defaults), set in a containers.conf
# this script writes. Builds reach Debian's mirror (--network host); containers run with no
# network but loopback. The image build compiles with the host's ccache folder (mounted in),
# so that what scripts/setup.sh compiled here is not compiled again (docker/README.md,
# "Compiler cache").
#
# Needs root (rootful podman). Environment:
#   PARTRAIN_IMAGE         image tag (default localhost/partrain:cpu)
#   PARTRAIN_DOCKER_STATE  where the containers.conf, base tarball and run outputs live
#                          (default ~/.cache/partrain-docker)
#   PARTRAIN_DOCKER_CCACHE the ccache folder the image build compiles with (default: the host's,
#                          $CCACHE_DIR or ~/.cache/ccache, which scripts/setup.sh fills);
#                          `none`: only the image's own cache mount (as with plain docker build)
#   PARTRAIN_DOCKER_TESTS  ctest options for the suite run inside the image build (default
#                          `-L ^(common|config)$`: scripts/test.sh has run the whole suite on
#                          this same Debian just before); `all`: every test
#   JOBS                   build parallelism inside the image (default 2)
#   SKIP_APT=1             do not install podman & co. (already there)
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

image=${PARTRAIN_IMAGE:-localhost/partrain:cpu}
base_image=docker.io/library/debian:bookworm
state=${PARTRAIN_DOCKER_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/partrain-docker}
pod=partrain-check-$$

log() { printf '[docker-check %4ds] %s\n' "$((SECONDS - started))" "$*"; }
fail() { log "FAILED: $*" >&2; exit 1; }

if [ "$#" -gt 0 ]; then steps=" $* "; else steps=" base build version quickstart pod "; fi
want() { [[ "$steps" == *" $1 "* ]]; }

[ "$(id -u)" -eq 0 ] || { echo "docker-check: needs root (rootful podman)" >&2; exit 2; }

# --- tools ------------------------------------------------------------------------------
# shellcheck source=scripts/apt-sources.sh
. scripts/apt-sources.sh
packages=(podman runc conmon catatonit containernetworking-plugins debootstrap
          debian-archive-keyring tar)
[ "${SKIP_APT:-0}" = 1 ] || apt_install_missing "${packages[@]}"

mkdir -p "$state"
export CONTAINERS_CONF="$state/containers.conf"
cat > "$CONTAINERS_CONF.tmp" <<'CONF'
# Written by scripts/docker-check.sh.
[containers]
# podman's default nofile/nproc exceed this machine's hard limits; RUN steps and containers
# fail to start with them.
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
log "podman $(podman version --format '{{.Client.Version}}'), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'), cgroups $(podman info --format '{{.Host.CgroupManager}}')"

# --- base image: debootstrap + import ---------------------------------------------------
# The mirror and suites apt already uses for bookworm (main, updates, security), so the image
# sees what this machine sees.

if want base; then
  if podman image exists "$base_image"; then
    log "base: $base_image is there"
  else
    mirror=$(apt_bookworm_mirror)
    root=$(mktemp -d "$state/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    log "base: debootstrap --variant=minbase bookworm ${mirror:-from the default mirror}"
    debootstrap --variant=minbase bookworm "$root" ${mirror:+"$mirror"} > "$state/debootstrap.log" 2>&1 ||
      { tail -20 "$state/debootstrap.log" >&2; fail "debootstrap (log: $state/debootstrap.log)"; }
    suites=$(apt_bookworm_suites)
    if [ -n "$suites" ]; then
      echo "$suites" | awk '{printf "deb %s %s main\n", $1, $2}' > "$root/etc/apt/sources.list"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
    log "base: podman import -> $base_image"
    tar --numeric-owner -C "$root" -c . |
      podman import --quiet --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' - "$base_image" > /dev/null
    rm -rf "$root"
    trap - EXIT
  fi
fi

# --- the image -------------------------------------------------------------------------
# Free space on the file system holding a folder, as "12.3 GB".
free_space() { df --output=avail -B1 "$1" | awk 'NR == 2 {printf "%.1f GB", $1 / 1e9}'; }

# What earlier runs of this check leave behind: untagged images (the image a rebuild replaced,
# build stages) and the working containers of a build that was killed before it could remove
# them (podman lists those with --external, in status "unknown"; only those made from this
# check's base image go). The base image and the tagged image stay.
drop_leftovers() {
  local ids=()
  podman image prune -f > /dev/null 2>&1 || true
  mapfile -t ids < <(podman ps --all --external --filter status=unknown \
    --format '{{.ID}} {{.Image}}' 2>/dev/null | awk -v base="$base_image" '$2 == base {print $1}' || true)
  [ "${#ids[@]}" = 0 ] || podman rm -f "${ids[@]}" > /dev/null 2>&1 || true
}

if want build; then
  # The image runs scripts/setup.sh on the same Debian compiler as this host, so the objects
  # setup.sh compiled here serve it: the host's ccache folder is mounted into the build's RUN
  # steps and the Dockerfile's CCACHE_DIR names it. (setup.sh keeps the locale out of the
  # hash and CCACHE_BASEDIR makes paths relative, so /src in the image and this checkout agree.)
  ccache_dir=${PARTRAIN_DOCKER_CCACHE:-${CCACHE_DIR:-$HOME/.cache/ccache}}
  ccache_args=()
  if [ "$ccache_dir" != none ]; then
    mkdir -p "$ccache_dir"
    ccache_args=(--volume "$ccache_dir:/ccache-host" --build-arg CCACHE_DIR=/ccache-host)
  fi
  tests=${PARTRAIN_DOCKER_TESTS:-'-L ^(common|config)$'}
  [ "$tests" = all ] && tests=
  # The build stage holds every package of scripts/setup.sh, a few GB. Each step of it kept as a
  # layer of its own (podman's default, --layers) costs that again while it is committed and
  # stays on the disk as an untagged image afterwards, for a cache that no later check can use:
  # the source is copied in before the compile step, so a new commit misses it anyway. So the
  # steps run in one container, committed once per stage (--layers=false), and a build that
  # fails takes its container with it (--force-rm). What an earlier check left goes first.
  drop_leftovers
  graph_root=$(podman info --format '{{.Store.GraphRoot}}')
  log "build: podman build -f docker/Dockerfile.cpu -t $image, ccache: $ccache_dir, tests: ${tests:-all}, $(free_space "$graph_root") free in $graph_root (log: $state/build.log)"
  if ! podman build --layers=false --force-rm --network host --shm-size 1g \
         --build-arg JOBS="${JOBS:-2}" "${ccache_args[@]}" --build-arg TEST_ARGS="$tests" \
         -f docker/Dockerfile.cpu -t "$image" . > "$state/build.log" 2>&1; then
    tail -40 "$state/build.log" >&2
    drop_leftovers
    if grep -q 'no space left on device' "$state/build.log"; then
      fail "podman build: the disk holding $graph_root is full ($(free_space "$graph_root") free after clearing this check's leftovers; the build needs about 5 GB) (log: $state/build.log)"
    fi
    fail "podman build (log: $state/build.log)"
  fi
  # The Dockerfile prints ccache's counts for its compile step.
  grep -A6 '^ccache in ' "$state/build.log" | grep -E '^ccache in|Hits:|Misses:' | sed 's/^/  /' || true
  grep -E '([0-9]+% tests passed|tests failed out of)' "$state/build.log" | tail -1 | sed 's/^/  /' || true
  # The image this build replaced, and the build stage, are untagged now.
  drop_leftovers
  log "build: done, $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
fi

# Bounded: a hung run fails the check instead of holding it.
run_in_image() { timeout 900 podman run --rm --network none --shm-size 1g "$@"; }

if want version; then
  out=$(run_in_image "$image" version) || fail "partrain version"
  while IFS= read -r line; do echo "  $line"; done <<< "$out"
  echo "$out" | grep -q '^partrain ' || fail "partrain version printed no version line"
  echo "$out" | grep -q 'asio-ring' || fail "partrain version names no asio-ring backend"
  log "version: ok"
fi

# Reads a report.json on the host: the number of epochs and the final accuracy, and checks
# that training learned something (accuracy well above chance for 100 or 10 classes).
check_report() {
  python3 - "$1" "$2" <<'PY'
import json, sys
path, epochs = sys.argv[1], int(sys.argv[2])
r = json.load(open(path))
assert r["schema"] == "partrain.report/1", r["schema"]
assert len(r["epochs"]) == epochs, f'{len(r["epochs"])} epochs, expected {epochs}'
acc = r["final"]["test_accuracy"]
print(f'  {path}: world_size {r["env"]["world_size"]}, backend {r["env"]["backend"]}, '
      f'{len(r["epochs"])} epochs, final test_accuracy {acc:.3f}, {r["total_seconds"]:.1f} s')
assert acc > 0.2, f"final test accuracy {acc} is no better than chance"
PY
}

if want quickstart; then
  out_dir="$state/quickstart"
  rm -rf "$out_dir" && mkdir -p "$out_dir"
  log "quickstart: partrain run configs/quickstart.yaml in a container"
  run_in_image -v "$out_dir:/opt/partrain/runs/quickstart" "$image" run configs/quickstart.yaml \
    > "$state/quickstart.log" 2>&1 || { tail -20 "$state/quickstart.log" >&2; fail "quick start"; }
  check_report "$out_dir/report.json" 3 || fail "quick start report"
  log "quickstart: ok"
fi

# --- two containers, one job -------------------------------------------------------------
# The pod's only network is its own loopback, shared by its containers: rank 0's container
# hosts the tcp store on 127.0.0.1 and rank 1's joins it, as two hosts would over a network.
if want pod; then
  out_dir="$state/pod"
  rm -rf "$out_dir" && mkdir -p "$out_dir"
  token="pod-check-$$-$RANDOM"
  podman pod rm -f "$pod" > /dev/null 2>&1 || true
  podman pod create --name "$pod" --network none > /dev/null
  trap 'podman pod rm -f "$pod" > /dev/null 2>&1 || true' EXIT
  log "pod: $pod, two containers, one rank each, tcp://127.0.0.1:29531"
  for rank in 0 1; do
    podman run -d --pod "$pod" --name "$pod-rank$rank" --shm-size 1g \
      -e RANK="$rank" -e LOCAL_RANK=0 -e WORLD_SIZE=2 -e LOCAL_WORLD_SIZE=1 \
      -e PARTRAIN_RENDEZVOUS=tcp://127.0.0.1:29531 -e PARTRAIN_RUN_TOKEN="$token" \
      -v "$out_dir:/opt/partrain/runs/pod" \
      "$image" worker configs/quickstart.yaml --set output.dir=runs/pod --set train.epochs=2 > /dev/null
  done
  codes=()
  for rank in 0 1; do
    codes+=("$(timeout 600 podman wait "$pod-rank$rank" || echo timeout)")
    podman logs "$pod-rank$rank" > "$state/pod-rank$rank.log" 2>&1 || true
  done
  log "pod: exit codes rank0=${codes[0]} rank1=${codes[1]}"
  tail -3 "$state/pod-rank0.log" | sed 's/^/  [rank 0] /'
  tail -3 "$state/pod-rank1.log" | sed 's/^/  [rank 1] /'
  if [ "${codes[0]}" != 0 ] || [ "${codes[1]}" != 0 ]; then
    fail "pod run (logs: $state/pod-rank*.log)"
  fi
  check_report "$out_dir/report.json" 2 || fail "pod report"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["env"]["world_size"]==2, r["env"]' \
    "$out_dir/report.json" || fail "pod report: world_size is not 2"
  podman pod rm -f "$pod" > /dev/null
  trap - EXIT
  log "pod: ok"
fi

log "all asked steps passed in $((SECONDS - started)) s"
