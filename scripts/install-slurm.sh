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

# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
apt_install "$(missing)missing" slurm-wlm munge
[ -z "$(missing)" ] || say "apt-get installed slurm-wlm and munge but $(missing)is still not on PATH"
