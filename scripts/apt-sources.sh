# shellcheck shell=bash
# Sourced by scripts that need to know where this machine's apt gets Debian from: a machine
# may reach only the mirror it is configured for, so nothing here names a mirror of its own.

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
