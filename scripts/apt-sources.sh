# shellcheck shell=bash
# Sourced by the scripts that install Debian packages or need to know where this machine's apt
# gets Debian from: a machine may reach only the mirror it is configured for, so nothing here
# names a mirror of its own.

# "URI CODENAME" for each bookworm suite apt uses for packages (main, updates, security).
apt_bookworm_suites() {
  # shellcheck disable=SC2016 # apt's own $(FIELD) syntax, not the shell's
  apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 'Identifier: Packages' 2>/dev/null |
    awk '$2 ~ /^bookworm/' | sort -u
}

# The URI of the mirror apt uses for bookworm itself (empty when apt knows none).
apt_bookworm_mirror() {
  apt_bookworm_suites | awk '$2 == "bookworm" {print $1; exit}'
}

# Installs those of the Debian packages named in the arguments that are not installed yet
# (nothing, not even `apt-get update`, when all are); as root, else through sudo.
apt_install_missing() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  echo "installing ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
