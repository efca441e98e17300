# Sourced by scripts/install-podman.sh and scripts/build-image.sh, so that both take the engine
# the docker runner will take (launcher.local.docker.find_engine: Docker with a compose command,
# else podman with one; SMLAUNCH_CONTAINER_ENGINE picks one). `container_engine` prints its name,
# or prints why there is none to stderr and fails. Needs PY, the venv's Python.
container_engine() {
    [ -x "$PY" ] || { echo "$PY is missing: run 'make install' first" >&2; return 1; }
    "$PY" - <<'PYEOF'
import sys

from launcher.local.docker import find_engine
from launcher.local.spec import RunnerError

try:
    print(find_engine().name)
except RunnerError as exc:
    sys.exit(str(exc))
PYEOF
}
