#!/usr/bin/env bash
# Installs a container engine for the docker runner's tests and `make image`: Debian's podman,
# podman-compose, runc (crun fails under cgroups v1; where podman has both, it takes crun), the
# CNI dnsname plugin (the hosts find algo-1 by name) and mmdebstrap (the image's base is built
# from Debian's packages, scripts/build-image.sh). docs/local-docker.md has the details.
# Never fails `make test`: where no engine can be installed it prints one line saying why and
# exits 0, and the docker-runner tests skip with their own reason (no engine answers).
set -u

export PATH="$PATH:/usr/sbin:/sbin"
cd "$(dirname "$0")/.."

say() { echo "install-podman.sh: $*; the docker runner has no engine here (its tests skip)"; exit 0; }

# shellcheck source=scripts/engine.sh
. scripts/engine.sh
PY=${PY:-.venv/bin/python}

# An engine the docker runner can use already (Docker or podman, each with compose) is kept.
PACKAGES=
container_engine >/dev/null 2>&1 \
    || PACKAGES="podman podman-compose runc golang-github-containernetworking-plugin-dnsname"
command -v mmdebstrap >/dev/null 2>&1 || PACKAGES="$PACKAGES mmdebstrap"
[ -n "$PACKAGES" ] || exit 0

# shellcheck source=scripts/apt-install.sh
. scripts/apt-install.sh
# shellcheck disable=SC2086
apt_install "no container engine answers, or mmdebstrap is missing" $PACKAGES
if [[ " $PACKAGES " == *" podman "* ]] && ! why=$(container_engine 2>&1 >/dev/null); then
    say "podman is installed but the docker runner cannot use it: $why"
fi
