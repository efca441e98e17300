import subprocess
import sys


def test_backend_modules_import_without_boto3() -> None:
    code = (
        "import sys\n"
        "import launcher.backends.cwlogs, launcher.config.images, launcher.backends.sourcedir\n"
        "print(sorted(m for m in ('boto3', 'botocore') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
