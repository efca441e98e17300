import gzip
import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from launcher.backends.sourcedir import ARCHIVE_MTIME, DEFAULT_IGNORE, build_sourcedir
from launcher.wire.training.issues import SourceDirError
from tests.support.sourcedir import ROOT, write


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


def read(archive: Path, name: str) -> str:
    with tarfile.open(archive) as tar:
        return tar.extractfile(name).read().decode()


def test_source_dir_contents_and_default_ignore(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "out" / "sourcedir.tar.gz",
        entry_point="train.py",
        source_dir=project,
        include_packages=(),
    )
    assert bundle.files == [
        "data/vocab.txt",
        "lib/deep/layer.py",
        "lib/model.py",
        "run.sh",
        "train.py",
    ]
    # directories are stored too (an empty one survives), before their contents
    names = list(members(bundle.path))
    assert names == [
        "data",
        "data/vocab.txt",
        "lib",
        "lib/deep",
        "lib/deep/layer.py",
        "lib/model.py",
        "notebooks",
        "run.sh",
        "train.py",
    ]
    assert bundle.entry_point == "train.py"
    assert bundle.skipped_packages == []
    assert bundle.excluded == [".env", "key.pem"]  # credentials are reported, the rest is not
    assert read(bundle.path, "train.py") == "print('train')"


def test_bundle_describes_the_written_file(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project, include_packages=()
    )
    data = bundle.path.read_bytes()
    assert bundle.sha256 == hashlib.sha256(data).hexdigest()
    assert bundle.size_bytes == len(data)


def test_custom_ignore_replaces_defaults(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point="train.py",
        source_dir=project,
        include_packages=(),
        ignore=(*DEFAULT_IGNORE, "data", "*.sh"),
    )
    assert bundle.files == ["lib/deep/layer.py", "lib/model.py", "train.py"]


def test_entry_point_in_subdirectory(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point=Path("lib/model.py"),
        source_dir=str(project),
        include_packages=(),
    )
    assert bundle.entry_point == "lib/model.py"


def test_missing_entry_point_names_field_and_fix(project: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceDirError) as err:
        build_sourcedir(
            tmp_path / "a.tar.gz", entry_point="trian.py", source_dir=project, include_packages=()
        )
    message = str(err.value)
    assert "entry_point 'trian.py' not found in source_dir" in message
    assert str(project) in message
    assert "relative to source_dir" in message
    assert not (tmp_path / "a.tar.gz").exists()


@pytest.mark.parametrize("entry_point", ["../train.py", "/abs/train.py"])
def test_entry_point_outside_source_dir_is_refused(
    project: Path, tmp_path: Path, entry_point: str
) -> None:
    with pytest.raises(SourceDirError, match="relative to source_dir"):
        build_sourcedir(
            tmp_path / "a.tar.gz", entry_point=entry_point, source_dir=project, include_packages=()
        )


def test_entry_point_that_is_ignored_says_which_pattern(project: Path, tmp_path: Path) -> None:
    write(project / "venv" / "train.py")
    with pytest.raises(SourceDirError, match="excluded by ignore pattern 'venv'"):
        build_sourcedir(
            tmp_path / "a.tar.gz",
            entry_point="venv/train.py",
            source_dir=project,
            include_packages=(),
        )


def test_missing_source_dir(tmp_path: Path) -> None:
    with pytest.raises(SourceDirError, match="source_dir '.*nope' is not a directory"):
        build_sourcedir(
            tmp_path / "a.tar.gz", entry_point="train.py", source_dir=tmp_path / "nope"
        )


def test_entry_point_alone_without_source_dir(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point=project / "lib" / "model.py",
        source_dir=None,
        include_packages=(),
    )
    assert bundle.files == ["model.py"]
    assert bundle.entry_point == "model.py"


def test_missing_entry_point_without_source_dir(tmp_path: Path) -> None:
    with pytest.raises(SourceDirError, match="entry_point '.*ghost.py' is not a file"):
        build_sourcedir(tmp_path / "a.tar.gz", entry_point=tmp_path / "ghost.py", source_dir=None)


def test_dependencies_sit_at_root_under_their_basename(project: Path, tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    write(libs / "shared_utils" / "__init__.py")
    write(libs / "shared_utils" / "io.py")
    write(libs / "shared_utils" / "__pycache__" / "io.cpython-311.pyc")
    write(libs / "shared_utils" / ".git" / "HEAD")
    single = write(tmp_path / "elsewhere" / "helpers.py")
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point="train.py",
        source_dir=project,
        dependencies=[libs / "shared_utils", str(single)],
        include_packages=(),
    )
    assert "shared_utils/__init__.py" in bundle.files
    assert "shared_utils/io.py" in bundle.files
    assert "helpers.py" in bundle.files
    assert not [f for f in bundle.files if "__pycache__" in f or ".git" in f]


def test_dependency_colliding_with_source_dir_is_refused(project: Path, tmp_path: Path) -> None:
    write(tmp_path / "other" / "lib" / "x.py")
    with pytest.raises(SourceDirError, match="stored as 'lib'.*source_dir"):
        build_sourcedir(
            tmp_path / "a.tar.gz",
            entry_point="train.py",
            source_dir=project,
            dependencies=[tmp_path / "other" / "lib"],
            include_packages=(),
        )


def test_missing_dependency(project: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceDirError, match="dependency '.*gone' does not exist"):
        build_sourcedir(
            tmp_path / "a.tar.gz",
            entry_point="train.py",
            source_dir=project,
            dependencies=[tmp_path / "gone"],
            include_packages=(),
        )


def test_included_packages_sit_under_a_name_no_user_package_has(project: Path, tmp_path: Path,
                                                                 fake_package: str) -> None:
    """The user's package of the same name stays at the root, where the script imports it; the
    included one goes to _smlaunch/, which shadows nothing."""
    write(project / fake_package / "__init__.py", "VALUE = 'user'\n")
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                             include_packages=(fake_package,))
    assert bundle.skipped_packages == []
    assert read(bundle.path, f"{fake_package}/__init__.py") == "VALUE = 'user'\n"
    assert f"{fake_package}/sub/__init__.py" not in bundle.files
    assert read(bundle.path, f"_smlaunch/{fake_package}/__init__.py") == "VALUE = 'installed'\n"
    assert f"_smlaunch/{fake_package}/sub/__init__.py" in bundle.files
    assert members(bundle.path)["_smlaunch"].isdir()


def test_at_the_root_the_users_copy_of_a_package_wins(project: Path, tmp_path: Path, fake_package: str) -> None:
    write(project / fake_package / "__init__.py", "VALUE = 'user'\n")
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz",
        entry_point="train.py",
        source_dir=project,
        include_packages=(fake_package,),
        packages_dir="",
    )
    assert bundle.skipped_packages == [fake_package]
    assert read(bundle.path, f"{fake_package}/__init__.py") == "VALUE = 'user'\n"
    assert f"{fake_package}/sub/__init__.py" not in bundle.files


def test_a_dotted_name_ships_the_subpackage_and_its_parents_init(project: Path, tmp_path: Path,
                                                                 fake_package: str) -> None:
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                             include_packages=(f"{fake_package}.sub",))
    assert [f for f in bundle.files if f.startswith("_smlaunch/")] == [
        f"_smlaunch/{fake_package}/__init__.py", f"_smlaunch/{fake_package}/sub/__init__.py"]
    with pytest.raises(SourceDirError, match="not a regular package"):
        build_sourcedir(tmp_path / "b.tar.gz", entry_point="train.py", source_dir=project,
                        include_packages=(f"{fake_package}.nothing",))


def test_a_user_directory_named_like_the_packages_directory_is_refused(project: Path, tmp_path: Path,
                                                                       fake_package: str) -> None:
    write(project / "_smlaunch" / "x.py")
    with pytest.raises(SourceDirError, match="stored as '_smlaunch'"):
        build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                        include_packages=(fake_package,))


def test_unimportable_package(project: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceDirError, match="'no_such_pkg_xyz' is not importable"):
        build_sourcedir(
            tmp_path / "a.tar.gz",
            entry_point="train.py",
            source_dir=project,
            include_packages=("no_such_pkg_xyz",),
        )


def test_module_is_not_a_package(project: Path, tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "mods" / "lonely_module_xyz.py")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    with pytest.raises(SourceDirError, match="not a regular package"):
        build_sourcedir(
            tmp_path / "a.tar.gz",
            entry_point="train.py",
            source_dir=project,
            include_packages=("lonely_module_xyz",),
        )


def test_rebuild_is_byte_identical_despite_mtimes_and_umask(
    project: Path, tmp_path: Path, fake_package: str
) -> None:
    kwargs = {"entry_point": "train.py", "source_dir": project, "include_packages": (fake_package,)}
    first = build_sourcedir(tmp_path / "one.tar.gz", **kwargs)
    for i, path in enumerate(sorted(project.rglob("*"))):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    (project / "train.py").chmod(0o600)  # permissions beyond the exec bit do not matter
    second = build_sourcedir(tmp_path / "two.tar.gz", **kwargs)
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == second.sha256

    raw = first.path.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip header MTIME
    for info in members(first.path).values():
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (
            ARCHIVE_MTIME, 0, 0, "", ""
        )
    modes = {name: info.mode for name, info in members(first.path).items()}
    assert modes["train.py"] == 0o644
    assert modes["run.sh"] == 0o755
    assert modes["lib"] == 0o755


def test_content_change_changes_the_digest(project: Path, tmp_path: Path) -> None:
    kwargs = {"entry_point": "train.py", "source_dir": project, "include_packages": ()}
    first = build_sourcedir(tmp_path / "one.tar.gz", **kwargs)
    write(project / "lib" / "model.py", "changed")
    assert build_sourcedir(tmp_path / "two.tar.gz", **kwargs).sha256 != first.sha256


def test_archive_written_inside_source_dir_is_not_bundled(project: Path) -> None:
    dest = project / "sourcedir.tar.gz"
    kwargs = {"entry_point": "train.py", "source_dir": project, "include_packages": ()}
    first = build_sourcedir(dest, **kwargs).sha256
    second = build_sourcedir(dest, **kwargs)
    assert "sourcedir.tar.gz" not in second.files
    assert second.sha256 == first


def test_dest_directory_is_refused(project: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceDirError, match="is a directory"):
        build_sourcedir(tmp_path, entry_point="train.py", source_dir=project)


def test_symlinks_inside_the_tree_are_followed(project: Path, tmp_path: Path) -> None:
    (project / "alias.py").symlink_to("lib/model.py")
    (project / "lib_link").symlink_to("lib", target_is_directory=True)
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project, include_packages=()
    )
    infos = members(bundle.path)
    assert infos["alias.py"].isfile()
    assert "lib_link/deep/layer.py" in bundle.files


def test_symlink_pointing_outside_is_refused(project: Path, tmp_path: Path) -> None:
    secret = write(tmp_path / "outside" / "secret.txt")
    (project / "leak.txt").symlink_to(secret)
    with pytest.raises(SourceDirError, match="symlink '.*leak.txt' points outside"):
        build_sourcedir(
            tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project, include_packages=()
        )


def test_broken_and_cyclic_symlinks_are_refused(project: Path, tmp_path: Path) -> None:
    kwargs = {"entry_point": "train.py", "source_dir": project, "include_packages": ()}
    (project / "dangling").symlink_to(project / "missing")
    with pytest.raises(SourceDirError, match="broken or loops"):
        build_sourcedir(tmp_path / "a.tar.gz", **kwargs)
    (project / "dangling").unlink()
    (project / "lib" / "up").symlink_to(project / "lib", target_is_directory=True)
    with pytest.raises(SourceDirError, match="own ancestor"):
        build_sourcedir(tmp_path / "a.tar.gz", **kwargs)


def test_gzip_stream_is_valid(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(
        tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project, include_packages=()
    )
    with gzip.open(bundle.path) as fh:
        assert len(fh.read()) % 512 == 0


def _job(source_dir: Path, instance_type: str = "ml.p5.48xlarge", **fields):
    from launcher.config import validate_job

    return validate_job({"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": instance_type,
                         "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 256}, **fields})


@pytest.mark.parametrize("bad", ["outside", "broken", "in a dependency"])
def test_validate_refuses_the_links_submit_refuses_in_the_same_words(tmp_path: Path, bad: str) -> None:
    """Issue 49: a symlink in source_dir pointing outside passed validate, and submit refused it. Both walk
    the tree with launcher.config.code_tree; a link inside the tree, and links in an ignored or a credential
    directory, pass both (the controls)."""
    from launcher.backends.sourcedir import build_job_sourcedir
    from launcher.wire.training.issues import ConfigError

    code, dep = tmp_path / "code", tmp_path / "dep"
    write(code / "train.py", "print('mine')\n")
    write(code / "lib" / "util.py", "X = 1\n")
    write(dep / "helper.py", "Y = 2\n")
    outside = write(tmp_path / "outside" / "secret.txt", "not the job's\n")
    (code / "alias.py").symlink_to(code / "lib" / "util.py")
    for skipped in ("node_modules", ".ssh"):  # ignored by default; left out as a credential directory
        (code / skipped).mkdir()
        (code / skipped / "link").symlink_to(outside)
    fields = {"dependencies": [str(dep)]}
    job = _job(code, "local", **fields)  # valid so far
    assert "alias.py" in build_job_sourcedir(job, tmp_path / "ok.tar.gz").files
    link, field, value = {"outside": (code / "leak.txt", "source_dir", str(code)),
                          "broken": (code / "dangling", "source_dir", str(code)),
                          "in a dependency": (dep / "leak.txt", "dependencies[0]", str(dep))}[bad]
    link.symlink_to(code / "missing" if bad == "broken" else outside)
    with pytest.raises(ConfigError) as validated:
        _job(code, "local", **fields)
    [issue] = validated.value.issues
    assert (issue.path, issue.value) == (field, value) and f"symlink '{link}'" in issue.problem
    with pytest.raises(SourceDirError) as submitted:
        build_job_sourcedir(job, tmp_path / "a.tar.gz")
    assert str(submitted.value) == f"{issue.problem}: {issue.fix}"


def _pyproject_specs() -> dict[str, str]:
    """What pyproject.toml asks for, by distribution name: the dependencies and the train extra."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["train"]
    return {line.split(">")[0].split("=")[0].split("<")[0].strip(): line for line in lines}


def test_a_runtime_job_for_sagemaker_ships_the_runtimes_requirements(tmp_path: Path) -> None:
    from launcher.backends.sourcedir import build_job_sourcedir

    bundle = build_job_sourcedir(_job(ROOT / "entrypoints"), tmp_path / "a.tar.gz")
    lines = [line for line in read(bundle.path, "requirements.txt").splitlines() if not line.startswith("#")]
    specs = _pyproject_specs()
    assert lines == [specs[name] for name in ("pydantic", "numpy", "safetensors", "huggingface_hub")]
    assert bundle.added_requirements == lines
    assert not any(line.startswith("torch") for line in lines)  # the image's; images.py checks its version


def test_local_jobs_and_user_scripts_get_no_requirements(tmp_path: Path) -> None:
    """Local runs use this machine's Python (or smlaunch's image): pip must not reach for the network."""
    from launcher.backends.sourcedir import build_job_sourcedir

    local = build_job_sourcedir(_job(ROOT / "entrypoints", "local"), tmp_path / "local.tar.gz")
    assert "requirements.txt" not in local.files and local.added_requirements == []
    write(tmp_path / "own" / "train.py", "print('mine')\n")
    script = build_job_sourcedir(_job(tmp_path / "own", framework_version="2.8.0", py_version="py312"),
                                 tmp_path / "own.tar.gz")
    assert "requirements.txt" not in script.files


def test_a_users_requirements_are_kept_and_completed(tmp_path: Path) -> None:
    from launcher.backends.sourcedir import build_job_sourcedir

    code = tmp_path / "code"
    write(code / "train.py", "from container.trainer import train\n")
    write(code / "requirements.txt", "pydantic==2.9.2\n-r more.txt\nwandb")
    bundle = build_job_sourcedir(_job(code), tmp_path / "a.tar.gz")
    text = read(bundle.path, "requirements.txt")
    specs = _pyproject_specs()
    assert text == ("pydantic==2.9.2\n-r more.txt\nwandb\n# smlaunch's runtime (added by smlaunch)\n"
                    f"{specs['numpy']}\n{specs['safetensors']}\n{specs['huggingface_hub']}\n")
    assert read(bundle.path, "train.py") == "from container.trainer import train\n"


def test_requirements_are_written_or_left_alone(project: Path, tmp_path: Path) -> None:
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                             include_packages=(), requirements=["numpy>=1.24"])
    assert read(bundle.path, "requirements.txt") == "# smlaunch's runtime (added by smlaunch)\nnumpy>=1.24\n"
    assert members(bundle.path)["requirements.txt"].mode == 0o644
    write(project / "requirements.txt", "HuggingFace.Hub==0.30\n")  # names compare as pip normalises them
    bundle = build_sourcedir(tmp_path / "b.tar.gz", entry_point="train.py", source_dir=project,
                             include_packages=(), requirements=["huggingface_hub>=0.26"])
    assert read(bundle.path, "requirements.txt") == "HuggingFace.Hub==0.30\n" and bundle.added_requirements == []


def test_an_installed_smlaunch_reads_its_requirements_from_its_metadata(tmp_path, monkeypatch) -> None:
    """Without a checkout's pyproject.toml beside the packages (a wheel install): the metadata."""
    from importlib.metadata import requires

    from launcher.config import requirements

    monkeypatch.setattr(requirements, "PYPROJECT", tmp_path / "site-packages" / "pyproject.toml")
    installed = [line.split(";")[0].strip() for line in requires("smlaunch")]
    lines = requirements.runtime_requirements()
    assert [line.split(">")[0].split("<")[0] for line in lines] == list(requirements.RUNTIME_DISTRIBUTIONS)
    assert set(lines) <= set(installed)


# --- credential files -----------------------------------------------------------------------------

CREDENTIALS = [".aws/credentials", ".ssh/id_rsa", "id_ed25519", "id_ed25519.pub", "deploy/id_ecdsa", "tls/server.key",
               "tls/server.pem", ".netrc", "_netrc", ".git-credentials", ".npmrc", ".pypirc", ".env", ".env.local",
               "app/.env.production", "credentials.json", "cert.p12", "cert.PFX", ".docker/config.json",
               ".dockercfg", ".kube/config", ".gnupg/private-keys-v1.d/k.key"]


def test_credential_files_are_left_out_and_listed(tmp_path: Path, caplog) -> None:
    src = tmp_path / "src"
    write(src / "train.py")
    write(src / "config.json")  # an ordinary config file of the same extension ships
    write(src / "keyboard.py")
    write(src / "app" / "settings.py")
    for name in CREDENTIALS:
        write(src / name, f"CREDENTIAL {name}")
    write(src / ".envdir" / "bin" / "python")  # a virtualenv named .env*: left out whole
    with caplog.at_level("WARNING", logger="launcher.backends.sourcedir"):
        bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=src,
                                 include_packages=(), ignore=())  # no ignore pattern lets them in
    assert bundle.files == ["app/settings.py", "config.json", "keyboard.py", "train.py"]
    assert bundle.excluded == sorted([".aws/", ".ssh/", ".gnupg/", ".envdir/", ".kube/config", ".docker/config.json",
                                      *(n for n in CREDENTIALS if not n.startswith((".aws/", ".ssh/", ".gnupg/",
                                                                                   ".kube/", ".docker/")))])
    with tarfile.open(bundle.path) as tar:
        contents = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert b"CREDENTIAL" not in contents
    assert len(bundle.notes) == 1 and bundle.notes[0].startswith("left out of a.tar.gz as credential files: .aws/, ")
    assert caplog.messages == bundle.notes  # shown to the user, whichever backend built it


def test_a_credential_file_named_in_dependencies_ships_with_a_note(project: Path, tmp_path: Path) -> None:
    netrc = write(tmp_path / "home" / ".netrc", "machine pypi.example.com password x")
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                             dependencies=[netrc], include_packages=())
    assert ".netrc" in bundle.files
    assert any(n.startswith(f"dependency '{netrc}' matches credential pattern '.netrc' and is shipped")
               for n in bundle.notes)


def test_a_credential_in_a_dependency_directory_is_left_out(project: Path, tmp_path: Path) -> None:
    write(tmp_path / "shared" / "util.py")
    write(tmp_path / "shared" / ".env", "TOKEN=x")
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project,
                             dependencies=[tmp_path / "shared"], include_packages=())
    assert "shared/util.py" in bundle.files and "shared/.env" not in bundle.files
    assert "shared/.env" in bundle.excluded


def test_an_entry_point_named_like_a_credential_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "src" / "id_rsa_tool.py")
    with pytest.raises(SourceDirError, match="entry_point 'id_rsa_tool.py' is left out as a credential file "
                                             r"\(pattern 'id_rsa\*'\): rename the script"):
        build_sourcedir(tmp_path / "a.tar.gz", entry_point="id_rsa_tool.py", source_dir=tmp_path / "src",
                        include_packages=())


def test_a_large_archive_gets_a_note_naming_its_largest_files(project: Path, tmp_path: Path, monkeypatch) -> None:
    from launcher.backends import sourcedir

    write(project / "data" / "big.bin").write_bytes(os.urandom(300_000))
    write(project / "data" / "medium.bin").write_bytes(os.urandom(200_000))
    small = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=project, include_packages=())
    assert not [n for n in small.notes if "MB (over" in n]
    monkeypatch.setattr(sourcedir, "LARGE_BUNDLE_BYTES", 400_000)
    monkeypatch.setattr(sourcedir, "LARGEST_SHOWN", 2)
    bundle = build_sourcedir(tmp_path / "b.tar.gz", entry_point="train.py", source_dir=project, include_packages=())
    note = bundle.notes[-1]
    assert note.startswith("b.tar.gz is 0.5 MB (over 0.4 MB), and every host downloads it before training; "
                           "largest files: data/big.bin (0.3 MB), data/medium.bin (0.2 MB). Leave data out")
