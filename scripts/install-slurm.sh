#!/usr/bin/env bash
# Installs Debian's slurm-wlm and munge for the tests' local Slurm cluster (tests/slurm_cluster.py).
# Never fails `make test`: where the install cannot happen it prints one line saying why and exits 0,
# and the Slurm tests skip with their own reason (the binaries they need are missing).
set -u

# Debian puts the daemons in /usr/sbin, which a non-login shell's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

missing() {
    local name
    for name in slurmctld slurmd sbatch munged mungekey; do
        command -v "$name" >/dev/null 2>&1 || printf '%s ' "$name"
    done
}

[ -z "$(missing)" ] && exit 0

say() { echo "install-slurm.sh: $*; the Slurm tests will skip"; exit 0; }

[ "$EUID" -eq 0 ] || say "$(missing)missing and installing slurm-wlm/munge needs root (uid is $EUID)"
command -v apt-get >/dev/null 2>&1 || say "$(missing)missing and there is no apt-get to install them"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
install() {
    DEBIAN_FRONTEND=noninteractive timeout 600 \
        apt-get install -y -q --no-install-recommends slurm-wlm munge >"$log" 2>&1
}
# The package lists are refreshed only when the install fails without them (that is slow).
if ! install; then
    timeout 300 apt-get update -q >>"$log" 2>&1 || say "apt-get update failed: $(tail -n 1 "$log")"
    install || say "apt-get install slurm-wlm munge failed: $(tail -n 1 "$log")"
fi
[ -z "$(missing)" ] || say "apt-get installed slurm-wlm and munge but $(missing)is still not on PATH"
