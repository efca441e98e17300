#!/usr/bin/env bash
# The wheels bench/gpu/run.py needs on the GPU machine that its image lacks (KINDS.md's package
# list): what launcher.wire imports (pydantic and its three), torchao for float8 (0.16.0: its
# float8 training is Python and Triton; its C++ extension is optional and only warns when it does
# not load). Not torchtitan 0.3.0: it imports torch.distributed.fsdp.DataParallelMeshDims, which the
# machine's torch 2.11 lacks (bench/gpu/titan.py records that as the reason). One version of each, no deps
# resolved (the device README's recipe), into the repository's ignored .whl/.
# Run from the repository root: bash bench/gpu/prepare.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
git check-ignore -q .whl/ || { echo "prepare.sh: .whl/ is not ignored (.gitignore names /.whl/)" >&2; exit 2; }
WHEELS=(
  pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2
  torchao==0.16.0
)
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${WHEELS[@]}"
ls -la .whl
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
wheels=$(du -sb .whl | cut -f1)
echo "wheels: $((wheels / 1024)) KiB; tree: $((tree / 1024)) KiB; together $(((tree + wheels) / 1048576)) MiB (limit 64)"
