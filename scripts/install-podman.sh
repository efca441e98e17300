#!/usr/bin/env bash
# Installs a container engine for the docker runner's tests and `make image`: Debian's podman,
# podman-compose, runc (crun fails under cgroups v1; where podman has both, it takes crun), the
# CNI dnsname plugin (the hosts find algo-1 by name) and mmdebstrap (the image's base is built
# from Debian's packages, scripts/build-image.sh). docs/local-docker.md has the details.
# Never fails `make test`: where no engine can be installed it prints one line saying why and
# exits 0, and the docker-runner tests skip with their own reason (no engine answers).
set -u

export PATH="$PATH:/usr/sbin:/sbin"

answers() { command -v "$1" >/dev/null 2>&1 && timeout 30 "$@" >/dev/null 2>&1; }
say() { echo "install-podman.sh: $*; the docker runner has no engine here (its tests skip)"; exit 0; }

# An engine that already works (Docker with compose, or podman with podman-compose) is kept.
PACKAGES=
if ! { answers docker info && answers docker compose version; } \
    && ! { answers podman info && command -v podman-compose >/dev/null 2>&1; }; then
    PACKAGES="podman podman-compose runc golang-github-containernetworking-plugin-dnsname"
fi
command -v mmdebstrap >/dev/null 2>&1 || PACKAGES="$PACKAGES mmdebstrap"
[ -n "$PACKAGES" ] || exit 0

# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
# shellcheck disable=SC2086
apt_install "no container engine answers, or mmdebstrap is missing" $PACKAGES
[[ " $PACKAGES " != *" podman "* ]] || answers podman info || say "podman is installed but cannot run containers (podman info: $(podman info 2>&1 | tail -n 1))"
