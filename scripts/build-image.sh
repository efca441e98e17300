#!/usr/bin/env bash
# Builds the smlaunch training image (container/Dockerfile) with podman or Docker.
#
#   scripts/build-image.sh [--tag smlaunch:latest] [--base-image IMAGE] [--fresh-base] [--if-engine]
#
# Without --base-image nothing is pulled from any registry: the base is made here from local
# material and the Dockerfile is built on it with the network off.
#   1. A wheelhouse (build/image/wheels): torch and the packages pyproject.toml's `dependencies` and
#      `train` extra name, at the lock's versions (requirements/lock.txt, as the venv has them)
#      and torch at the venv's (the CPU torch wheel on disk), fetched by the host's pip from the
#      package index it is configured with.
#   2. A Debian root file system from Debian's packages (mmdebstrap: Python, venv, CA certificates)
#      with a venv at /opt/venv holding the wheelhouse, imported into the engine as
#      smlaunch-base:<hash>. The hash covers the wheel files and the Debian settings, so a
#      second build reuses the base (the engine keeps it) until one of them changes;
#      --fresh-base builds it again (Debian's security updates change no hash).
#   3. container/Dockerfile with BASE_IMAGE=smlaunch-base:<hash>, --network none: smlaunch is
#      installed on the base's packages, nothing fetched.
# With --base-image (an AWS Deep Learning Container, pytorch/pytorch, ...) only step 3 runs, on
# that base, with the network the engine gives.
#
# --if-engine: where no engine answers, say so and exit 0 (`make test`: the docker-runner tests
# then skip with that reason). Any other failure exits non-zero. SMLAUNCH_CONTAINER_ENGINE=
# docker|podman picks the engine; SMLAUNCH_DEBIAN_MIRROR the Debian mirror.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=smlaunch:latest
BASE_IMAGE=
IF_ENGINE=0
FRESH_BASE=0
PY=${PY:-.venv/bin/python}
SUITE=bookworm  # Debian 12: Python 3.11, the version of the CPU torch wheel on disk
PYTHON_VERSION=3.11
GLIBC_MINOR=36
PACKAGES=python3,python3-venv,ca-certificates
MIRROR=${SMLAUNCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=build/image

usage() { echo "usage: $0 [--tag NAME:TAG] [--base-image IMAGE] [--fresh-base] [--if-engine]" >&2; exit 2; }
fail() { echo "build-image.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --tag) [ $# -ge 2 ] || usage; TAG=$2; shift 2;;
        --base-image) [ $# -ge 2 ] || usage; BASE_IMAGE=$2; shift 2;;
        --if-engine) IF_ENGINE=1; shift;;
        --fresh-base) FRESH_BASE=1; shift;;
        -h|--help) sed -n '2,25p' "$0"; exit 0;;
        *) echo "build-image.sh: unknown argument '$1'" >&2; usage;;
    esac
done
mkdir -p "$WORK"

# The engine the docker runner will take, so that the image is where the runner looks.
# shellcheck source=scripts/engine.sh
. scripts/engine.sh
if ! engine=$(container_engine 2>"$WORK/engine.txt"); then
    if [ "$IF_ENGINE" = 1 ]; then
        echo "build-image.sh: $(cat "$WORK/engine.txt")"
        echo "build-image.sh: no image built; the docker-runner tests will skip"
        exit 0
    fi
    fail "$(cat "$WORK/engine.txt")"
fi

started=$(date +%s)

if [ -z "$BASE_IMAGE" ]; then
    command -v mmdebstrap >/dev/null 2>&1 || fail "mmdebstrap is missing (Debian/Ubuntu: apt-get install mmdebstrap); or give --base-image"
    # 1. The wheelhouse, pinned to the lock's versions; afresh, so no earlier version lingers
    # (pip's cache makes the download quick).
    rm -rf "$WORK/wheels"
    mkdir -p "$WORK/wheels"
    # What the installed smlaunch requires, without an extra or with the `train` one.
    "$PY" - > "$WORK/wheels/requirements.txt" <<'EOF'
from importlib.metadata import requires
for requirement in requires("smlaunch"):
    name, _, marker = requirement.partition(";")
    if marker.strip().replace("'", '"') in ("", 'extra == "train"'):
        print(name.strip())
EOF
    # The lock's pins as constraints, its `name==version` lines without their hashes (with them,
    # pip would want every requirement pinned), and torch, which the lock leaves out, at the
    # venv's version.
    { sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]*\).*/\1/p' requirements/lock.txt
      "$PY" -c 'from importlib.metadata import version; print("torch==" + version("torch"))'
    } > "$WORK/constraints.txt"
    # Wheels for the base's Python and glibc (2.36): pip takes each manylinux tag only as named.
    # scripts/uv-pip.py --pip: pip without its "Location '...' is ignored" warning per package.
    platforms=()
    for minor in $(seq 5 "$GLIBC_MINOR"); do platforms+=(--platform "manylinux_2_${minor}_$(uname -m)"); done
    "$PY" scripts/uv-pip.py --pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version "$PYTHON_VERSION" "${platforms[@]}" \
        --dest "$WORK/wheels" -c "$WORK/constraints.txt" -r "$WORK/wheels/requirements.txt" \
        || fail "pip could not fetch the wheelhouse into $WORK/wheels (see above)"
    # 2. The base, unless the engine has it already.
    hash=$( (ls "$WORK/wheels"; echo "$SUITE $PACKAGES $MIRROR"; sed -n '/^    # 2\./,/^    # 3\./p' "$0") \
        | sha256sum | cut -c1-16)
    base="smlaunch-base:$hash"
    if [ "$FRESH_BASE" = 0 ] && "$engine" image inspect "$base" >/dev/null 2>&1; then
        echo "build-image.sh: reusing $base"
    else
        echo "build-image.sh: building $base from Debian $SUITE and $(ls "$WORK"/wheels/*.whl | wc -l) wheels"
        rm -f "$WORK/rootfs.tar"
        # The venv's bytecode is checked against its sources' hashes, not their times: mmdebstrap
        # clamps the times of the files it packs to its start, so bytecode checked by time was stale
        # and every process of the image compiled torch again (import of the runtime 5.0 s, not 2.8).
        # torch's py312_intrinsics.py is for Python 3.12 and later: 3.11 cannot compile it.
        mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
            --customize-hook="copy-in $WORK/wheels /tmp" \
            --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
            --customize-hook='chroot "$1" /opt/venv/bin/pip install --quiet --no-cache-dir --no-compile --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt' \
            --customize-hook='chroot "$1" /opt/venv/bin/python -m compileall -q -j 0 --invalidation-mode checked-hash -x /py312_intrinsics.py /opt/venv/lib' \
            --customize-hook='rm -rf "$1/tmp/wheels"' \
            "$SUITE" "$WORK/rootfs.tar" "deb $MIRROR $SUITE main" \
            || fail "mmdebstrap could not make the root file system (see above)"
        "$engine" import \
            --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
            "$WORK/rootfs.tar" "$base" >/dev/null || fail "$engine import of $WORK/rootfs.tar failed (see above)"
        rm -f "$WORK/rootfs.tar"
    fi
    BASE_IMAGE=$base
    network=(--network none)
else
    network=()
fi

# 3. smlaunch on the base.
"$engine" build "${network[@]}" -f container/Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$TAG" . \
    || fail "$engine build of container/Dockerfile on $BASE_IMAGE failed (see above)"
echo "build-image.sh: $TAG built with $engine on $BASE_IMAGE in $(( $(date +%s) - started )) s"
