"""`source_ignore` adds patterns to the default ignore list of sourcedir.tar.gz."""

import tarfile

from launcher.backends.sagemaker import SageMakerBackend
from launcher.config import validate_job


def test_source_ignore_adds_to_defaults(tmp_path, monkeypatch):
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / ".git").mkdir()
    (code / "train.py").write_text("")
    (code / "data" / "big.bin").write_bytes(b"x")
    (code / ".git" / "HEAD").write_text("ref")
    (code / "keep.py").write_text("")
    job = validate_job({"entry_point": "train.py", "source_dir": str(code), "instance_type": "ml.g5.xlarge",
                        "role": "arn:aws:iam::111122223333:role/R", "source_ignore": ["data"],
                        "framework_version": "2.8.0", "py_version": "py312"})  # a user script names its image
    backend = SageMakerBackend(region="us-east-1")
    bundle = backend._bundle(job, tmp_path)
    with tarfile.open(bundle.path) as tar:
        names = set(tar.getnames())
    assert "train.py" in names and "keep.py" in names
    assert not any(n.startswith(("data", ".git")) for n in names)
