"""A user's own script against the machine it will run on, before anything is installed or started
(docs/own-scripts.md): its imports (launcher.config.script_imports) against what the target has,
and which torch the job gets.

Targets: this machine's Python (the local process runner, Slurm), a local container image, or a
SageMaker image (the SMP v2 image, a PyTorch DLC, an image_uri of the user's). A module that
exists only in images the job does not run on (launcher.config.image_libraries: SMP v2's
`torch.sagemaker` on a plain DLC or locally, SMP v1's `smdistributed.modelparallel` on an SMP v2
image or a DLC without it) is an error naming where it exists and how to run there; a module the target is
not known to have and requirements.txt does not ask for is a warning; an import inside a `try:`
that catches ImportError is the script's own fallback and passes.
"""

from __future__ import annotations

# Imports inside functions: importlib.metadata loads only for the jobs that need it (CLI start-up).
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.config import backend_table
from launcher.config.image_libraries import LIBRARIES, SMDDP, SMP_V1, SMP_V2, image_libraries
from launcher.config.images import ImageResolutionError, job_image_choice
from launcher.config.requirement_paths import local_paths
from launcher.config.script_imports import Import, script_imports
from launcher.wire.training.issues import Issue

_RUN_ON = {
    SMP_V2: "run it on SageMaker with distribution {torch_distributed: {enabled: true}, smdistributed: "
            "{modelparallel: {enabled: true}}} on an instance with NVIDIA GPUs (ml.p4d, ml.p5), or train with "
            "smlaunch's runtime (entrypoints/train.py), which needs no SMP",
    SMP_V1: "run it on SageMaker with framework_version 1.13.1 (py_version py39) or 2.0.0 (py310) on an instance "
            "with NVIDIA GPUs and distribution {smdistributed: {modelparallel: {enabled: true, parameters: {...}}}, "
            "mpi: {enabled: true, processes_per_host: 8}}, or port it to SMP v2 (torch.sagemaker)",
    SMDDP: "run it on SageMaker on an instance with NVIDIA GPUs, on a PyTorch DLC that carries SMDDP "
           "(framework_version 1.13.1 to 2.2.0 with distribution {smdistributed: {dataparallel: {enabled: true}}}) "
           "or on the SMP v2 image",
}
# Modules only some SageMaker images have: the libraries (launcher.config.image_libraries) any of which
# provides them, where those are, and how to run there.
ONLY_IN = {
    **{module: (frozenset({module}), LIBRARIES[module].where, _RUN_ON[module]) for module in LIBRARIES},
    "smdistributed": (frozenset({SMP_V1, SMDDP}), "SageMaker's PyTorch GPU images that carry SMP v1 or SMDDP",
                      "run it on SageMaker on an instance with NVIDIA GPUs, with a PyTorch DLC that carries them"),
}


def only_in(module: str) -> tuple[frozenset[str], str, str] | None:
    """ONLY_IN's entry for `module` or the package it is in (the longest that applies)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = ONLY_IN.get(".".join(parts[:i]))
        if found is not None:
            return found
    return None


# What the SageMaker images are known to hold beyond the standard library (their release notes'
# package lists; a module missing here and in requirements.txt is a warning, not an error). SageMaker's
# distributed libraries are in some images only: ONLY_IN.
DLC_MODULES = frozenset({"torch", "torchvision", "torchaudio", "torchdata", "numpy", "scipy", "pandas", "boto3",
                         "botocore", "sagemaker", "sagemaker_training", "smdebug", "PIL", "cv2", "requests",
                         "yaml", "packaging", "psutil", "tqdm", "urllib3", "awscli", "mpi4py", "h5py",
                         "triton", "sympy", "networkx", "jinja2", "fsspec", "filelock"})
SMP_MODULES = DLC_MODULES | {"transformer_engine", "flash_attn", "apex", "megatron"}
# requirements.txt names whose module is named otherwise
_DISTRIBUTION_MODULES = {"pillow": "PIL", "opencv_python": "cv2", "opencv_python_headless": "cv2",
                         "scikit_learn": "sklearn", "pyyaml": "yaml", "beautifulsoup4": "bs4",
                         "protobuf": "google", "python_dateutil": "dateutil", "flash_attn": "flash_attn",
                         "transformer_engine": "transformer_engine", "torch": "torch", "sentencepiece":
                         "sentencepiece", "pytorch_lightning": "pytorch_lightning"}


@dataclass(frozen=True)
class Target:
    """Where the script's Python runs: `kind` process (this machine), smp (the SMP v2 image), dlc (a
    PyTorch DLC), smlaunch-image (smlaunch's own), image (the user's: its contents not known).
    `libraries`: the modules of image_libraries.LIBRARIES it has."""

    kind: str
    label: str
    libraries: frozenset[str] = frozenset()


def target_of(job, instance_type: str | None, region: str) -> Target:
    """The job's target (`job` a JobConfig): its backend's (the backend table's target), else its image."""
    row = backend_table.named(job.backend_name)
    if row.target is not None:
        return Target(*backend_table.load(row.target)(job))
    if job.image_uri and not re.search(r"/(pytorch-training|smdistributed-modelparallel):", job.image_uri):
        return Target("image", f"the image {job.image_uri}")
    try:
        choice = job_image_choice(job, instance_type or "ml.p5.48xlarge", region, runtime=False)
    except ImageResolutionError:
        return Target("image", "an image validation could not resolve")
    libraries = image_libraries(choice.uri, choice.torch)
    if "smdistributed-modelparallel" in choice.uri:
        return Target("smp", f"the SMP v2 image {choice.uri}", libraries)
    return Target("dlc", f"the PyTorch DLC {choice.uri}", libraries)


def requirement_modules(source_dir: Path | None) -> set[str]:
    """The modules requirements.txt (in source_dir) asks for, as far as names tell: the distributions
    it names, and the local packages it installs (`-e ./pkg`, `./pkg`, a wheel) by their files."""
    path = source_dir / "requirements.txt" if source_dir is not None else None
    if path is None or not path.is_file():
        return set()
    modules = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match and not line.lstrip().startswith(("-", "#")):
            modules.add(_module_of(match.group(1)))
    for local in local_paths(source_dir):
        if local.installs and local.path.exists():
            modules |= _package_modules(local.path)
    return modules


def _module_of(distribution: str) -> str:
    name = re.sub(r"[-.]+", "_", distribution).lower()
    return _DISTRIBUTION_MODULES.get(name, name)


def _package_modules(path: Path) -> set[str]:
    """The top-level modules a local package provides: a directory's modules and packages, at its
    root or under src/ (setuptools' two layouts), and its project's name; an archive's distribution."""
    if path.is_file():  # pip's archive names: <name>-<version>[-...].whl, <name>-<version>.tar.gz
        return {_module_of(path.name.split("-", 1)[0])}
    modules = set()
    for directory in (path, path / "src"):
        for child in directory.iterdir() if directory.is_dir() else ():
            if child.suffix == ".py" and child.name != "setup.py" and child.stem.isidentifier():
                modules.add(child.stem)
            elif child.is_dir() and (child / "__init__.py").is_file():
                modules.add(child.name)
    return modules | _project_name(path / "pyproject.toml")


def _project_name(pyproject: Path) -> set[str]:
    """The module of pyproject.toml's [project] name (read without tomllib: Python 3.10 has none)."""
    text = pyproject.read_text(encoding="utf-8", errors="replace") if pyproject.is_file() else ""
    table = re.search(r"(?ms)^\[project\][ \t]*$(.*?)(?=^\[|\Z)", text)
    name = re.search(r"(?m)^\s*name\s*=\s*[\"']([A-Za-z0-9._-]+)[\"']", table.group(1)) if table else None
    return {_module_of(name.group(1))} if name else set()


def _available(target: Target, imp: Import, requested: set[str]) -> bool:
    if imp.top in requested or imp.top.lower() in requested:
        return True
    if target.kind == "process":
        return importlib.util.find_spec(imp.top) is not None  # locates the top package, imports nothing
    if target.kind in ("smp", "dlc"):
        return imp.top in (SMP_MODULES if target.kind == "smp" else DLC_MODULES)
    return True  # an image of the user's, or smlaunch's (its packages: requirements/lock.txt): not listed here


def import_issues(imports: list[Import], target: Target, source_dir: Path | None) -> list[Issue]:
    """Each import against the target (see the module docstring)."""
    requested = requirement_modules(source_dir)
    issues = []
    tops: dict[str, Import] = {}  # each top-level package once: its first required import, else its first
    for imp in imports:
        special = only_in(imp.module)
        if special is not None:
            libraries, where, fix = special
            if not libraries & target.libraries and target.kind != "image" and not imp.optional and \
                    all(i.value != imp.where for i in issues):  # `from a.b import c` names a.b and a.b.c
                issues.append(Issue("entry_point", imp.where, f"imports {imp.module}, which exists only in {where}; "
                                    f"this job runs on {target.label}", fix))
        elif imp.top not in tops or (tops[imp.top].optional and not imp.optional):
            tops[imp.top] = imp
    for imp in tops.values():
        if not imp.optional and not _available(target, imp, requested):
            issues.append(Issue("entry_point", imp.where, f"imports {imp.top}, which {target.label} is not known to "
                                f"have and requirements.txt does not list",
                                f"add it to {'source_dir/' if source_dir else ''}requirements.txt, or make the "
                                "import optional (try/except ImportError) if the script can do without it",
                                "warning"))
    return issues


def job_torch(job, target: Target, image_torch: str | None = None) -> str:
    """Which torch the job gets, for validate's summary."""
    if target.kind == "process":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("torch")
        except PackageNotFoundError:
            found = "none installed"
        asked = (f"; framework_version {job.framework_version} names a SageMaker image, which this job does not run"
                 if job.framework_version else "")
        return f"{found} ({target.label}{asked})"
    if image_torch:
        return f"{image_torch} ({target.label})"
    return f"the image's ({target.label})"


def entry_imports(entry: Path | None, source_dir: Path | None) -> list[Import] | None:
    """The script's imports, when its entry point is a file on this machine (None: on S3)."""
    if entry is None or not entry.is_file():
        return None
    return script_imports(entry, source_dir)


def uses_smp(imports: list[Import] | None) -> bool:
    """Whether the script uses AWS's SMP library, v2 or v1 (and so lives by SMP's documented rules)."""
    return any(only_in(i.module) in (ONLY_IN[SMP_V2], ONLY_IN[SMP_V1]) for i in imports or ())


def check_script_imports(ctx) -> list[Issue]:
    """A user script's imports against its target (context.Context; the runtime's are smlaunch's own)."""
    if ctx.runtime or ctx.imports is None:
        return []
    target = target_of(ctx.job, ctx.instance.name if ctx.instance else None, ctx.region)
    return import_issues(ctx.imports, target, ctx.code_dir)
