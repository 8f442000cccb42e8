# Test hosts made of Linux network namespaces, for shell tests and benchmarks: the same
# hosts as netns.h (each a namespace with its own loopback and one NIC, eth0, plugged into a
# bridge in a namespace of its own; real TCP over 10.A.B.0/24; names host0, host1, ... in
# /etc/netns/NS/hosts, which `ip netns exec` mounts over /etc/hosts). On top of netns.h, each
# process started with netns_run also gets a UTS namespace whose host name is hostI, as on
# a real cluster, where tools that advertise `hostname` (torchrun does) must name the node.
#
#   . tests/multinode/netns.sh
#   netns_why_not && skip "$(netns_why_not)"   # prints why hosts cannot be made here, if so
#   netns_up 2 || fail                   # hosts 0 and 1; netns_down removes them
#   netns_run 1 COMMAND...               # runs COMMAND inside host 1 (exec: use & for background)
#   netns_kill 1                         # SIGKILL to everything inside host 1
#   netns_address 1                      # 10.A.B.2
#
# Names carry the shell's pid (ptn<PID>xs...) as netns.h's do (ptn<PID>x<N>...), so that the
# namespaces of a test killed outright are removed as leftovers by the next netns.h user.
# Call netns_down from an EXIT trap.
# shellcheck shell=bash

netns_prefix=ptn$$xs
netns_subnet_b=$(($$ % 250))
netns_made=()

# Prints why no hosts can be made here (and returns 0), or nothing (and returns 1).
netns_why_not() {
  if [ "$(id -u)" != 0 ]; then
    echo "network namespaces need root (this runs as uid $(id -u))"
  elif ! command -v ip > /dev/null; then
    echo "the ip command (iproute2) is missing: run scripts/setup.sh"
  elif ! command -v unshare > /dev/null; then
    echo "the unshare command (util-linux) is missing"
  else
    return 1
  fi
}

netns_name() { echo "${netns_prefix}h$1"; }
netns_address() { echo "10.78.$netns_subnet_b.$(($1 + 1))"; }

# netns_up COUNT: makes hosts 0..COUNT-1 and waits (bounded) until host 0 reaches the others.
netns_up() {
  local count=$1 bridge=${netns_prefix}br i ns hosts_file
  ip netns add "$bridge" || return 1
  netns_made+=("$bridge")
  ip -n "$bridge" link add br0 type bridge && ip -n "$bridge" link set br0 up || return 1
  hosts_file="127.0.0.1 localhost"$'\n'
  for ((i = 0; i < count; i++)); do
    hosts_file+="$(netns_address "$i") host$i"$'\n'
  done
  for ((i = 0; i < count; i++)); do
    ns=$(netns_name "$i")
    ip netns add "$ns" || return 1
    netns_made+=("$ns")
    ip -n "$ns" link add eth0 type veth peer name "h$i" netns "$bridge" &&
      ip -n "$bridge" link set "h$i" master br0 &&
      ip -n "$bridge" link set "h$i" up &&
      ip -n "$ns" addr add "$(netns_address "$i")/24" dev eth0 &&
      ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up || return 1
    mkdir -p "/etc/netns/$ns" && printf '%s' "$hosts_file" > "/etc/netns/$ns/hosts" || return 1
  done
  # A TCP connect to a closed port is refused at once when the link works: 100 tries, 50 ms apart.
  local attempt
  for ((attempt = 0; attempt < 100; attempt++)); do
    local all=1
    for ((i = 1; i < count; i++)); do
      local answer
      answer=$(ip netns exec "$(netns_name 0)" timeout 1 \
        bash -c "exec 3<>/dev/tcp/$(netns_address "$i")/9" 2>&1) || true
      [[ $answer == *refused* ]] || all=0
    done
    [ "$all" = 1 ] && return 0
    sleep 0.05
  done
  return 1
}

# netns_run HOST COMMAND...: COMMAND inside host HOST, in a UTS namespace named hostHOST.
netns_run() {
  local host=$1
  shift
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner bash
  exec ip netns exec "$(netns_name "$host")" unshare --uts \
    bash -c 'hostname "$0" && exec "$@"' "host$host" "$@"
}

# netns_kill HOST: SIGKILL to every process inside host HOST, as when the machine loses power.
netns_kill() { netns_kill_in "$(netns_name "$1")"; }

# netns_kill_in NAMESPACE (bounded: 50 rounds, 20 ms apart).
netns_kill_in() {
  local ns=$1 round pids
  for ((round = 0; round < 50; round++)); do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086  # one pid a word
    kill -9 $pids 2> /dev/null
    sleep 0.02
  done
  return 1
}

# Removes every namespace netns_up made, the processes inside them first.
netns_down() {
  local i ns
  for ((i = ${#netns_made[@]} - 1; i >= 0; i--)); do
    ns=${netns_made[i]}
    netns_kill_in "$ns" || true
    ip netns del "$ns" 2> /dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  netns_made=()
}
