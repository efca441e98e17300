"""`python -m container train`: the training image's command (SageMaker starts `<image> train`);
`python -m container pod`: a Kubernetes pod's (container.toolkit.pod), which writes the pod's /opt/ml
tree and then trains as `train` does; `python -m container trace`: one rank of a job traced at its whole
world on a fake process group (container.trace, for `smlaunch plan --trace`)."""

# Imports inside functions: the bootstrap (and the catalog it imports) loads after the usage check.
from __future__ import annotations

import sys

USAGE = "usage: python -m container train|pod|trace"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["pod"]:
        from container.toolkit.pod import main as pod  # after the usage check, as train

        return pod()
    if argv == ["trace"]:
        from container.trace import main as trace  # after the usage check, as train

        return trace()
    if argv != ["train"]:
        print(USAGE, file=sys.stderr)
        return 2
    from container.toolkit.bootstrap import train  # after the usage check: it imports the catalog

    return train()


if __name__ == "__main__":
    sys.exit(main())
