import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from launcher.backends.sourcedir import build_sourcedir
from tests.support.sourcedir import ROOT


def test_included_package_is_importable_from_the_extracted_archive(
    project: Path, tmp_path: Path, fake_package: str
) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point="train.py",
        source_dir=project,
        include_packages=(fake_package,),
    )
    assert f"_smlaunch/{fake_package}/__init__.py" in bundle.files
    assert f"_smlaunch/{fake_package}/sub/__init__.py" in bundle.files
    assert not [f for f in bundle.files if "__pycache__" in f]
    code_dir = tmp_path / "code"
    with tarfile.open(bundle.path) as tar:
        tar.extractall(code_dir, filter="data")  # the strict filter newer Pythons default to
    # a fresh interpreter that only sees the code directory and what the entry point puts on the
    # path (train.py: _smlaunch/), like a stock AWS image
    out = subprocess.run(
        [sys.executable, "-c", f"import {fake_package} as p; print(p.VALUE, p.__file__)"],
        cwd=code_dir,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{code_dir}{os.pathsep}{code_dir / '_smlaunch'}"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("installed " + str(code_dir / "_smlaunch"))


def test_what_the_runtime_imports_is_the_image_or_the_requirements(tmp_path: Path) -> None:
    """Every distribution train.py's imports load beyond PyTorch's own is one requirements.txt installs."""
    pytest.importorskip("torch")
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    from launcher.config.requirements import runtime_requirements

    code = ("import sys\n"
            "import torch, torch.distributed.fsdp, torch.distributed.tensor, torch.distributed.checkpoint, "
            "torch.utils.data, torch.utils.checkpoint\n"
            "before = set(sys.modules)\n"
            "sys.path.insert(0, 'entrypoints')\n"
            "import train, container.args, container.distributed.runtime, container.trainer, "
            "container.checkpoint.pretrained, container.checkpoint.hf_export\n"
            "print(' '.join(set(sys.modules) - before))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    owners = packages_distributions()

    def norm(requirement: str) -> str:
        name = requirement.split(";")[0]
        for stop in "[<>=!~ ":
            name = name.split(stop)[0]
        return name.strip().lower().replace("_", "-")

    imported = {norm(d) for m in loaded for d in owners.get(m.split(".")[0], [])}
    installed, todo = set(), [norm(r) for r in runtime_requirements()]
    while todo:  # what pip installs for the requirements, dependencies included
        name = todo.pop()
        if name not in installed:
            installed.add(name)
            try:
                todo += [norm(d) for d in requires(name) or [] if "extra ==" not in d]
            except PackageNotFoundError:
                pass
    assert {"pydantic", "safetensors"} <= imported
    assert imported - installed <= {"smlaunch", "torch"}, imported - installed  # torch: the image's


# --- credential files -----------------------------------------------------------------------------


