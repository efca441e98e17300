"""notebooks/walkthrough.ipynb runs top to bottom: the seed's three runs planned (OOM predicted
for the p4d run without CP, the CP 8 run fits, FP8 refused on A100 and planned on p5), the
no-CP and CP 2 layouts trained locally, a pretrained model fine-tuned on text packed with its
tokenizer (first loss = transformers', artifact loaded back), and that model chat fine-tuned
(dataset_type chat: it answers a question it was taught, through the artifact's chat template),
and a short local sweep of two trials over lr (the best is the lower validation loss of their own metrics).
The notebook asserts its own key results as it goes. The sweep's cell runs a second time in the same
kernel, as a rerun of the notebook would: its fixed name was taken the second time (issue 49)."""

from __future__ import annotations

import copy
import re

import nbclient
import nbformat

from tests.support.train_runs import ROOT


def text_of(cell) -> str:
    return "".join(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)


def test_walkthrough_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SMLAUNCH_NOTEBOOK_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("SMLAUNCH_ROOT", str(ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(ROOT / "notebooks" / "walkthrough.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    sweep = next(i for i, c in enumerate(nb.cells) if "HyperparameterTuner(" in c.source)
    again = nbformat.from_dict(copy.deepcopy(nb.cells[sweep]))
    with client.setup_kernel():
        client.execute(cleanup_kc=False)
        first = text_of(nb.cells[sweep])
        client.execute_cell(again, sweep)  # which takes the sweep cell's place in nb
    out = "\n".join(text_of(c) for c in nb.cells if c.cell_type == "code")
    assert 'Tried to allocate 7.83 GiB' in out and "does not fit" in out
    assert "--set context_parallel_degree=" in out
    assert "has no FP8" in out and "ml.p5.48xlarge" in out
    assert out.count("model artifact:") == 2
    ours, reference = map(float, re.search(r"first loss (\S+); transformers on the same blocks (\S+)", out).groups())
    assert abs(ours - reference) <= 1e-5 * reference
    assert "tokenizer.json" in out and "generated: " in out
    # the chat fine-tune: the job log's line on the examples, and the answer before and after
    assert "data: chat examples of train, shuffled (seed 7): 7 examples in 1 file(s)" in out
    assert "chat template kept: True" in out
    before, after = re.search(r"before: What is the capital of France\? -> (.*)\nafter:  What is the capital of "
                              r"France\? -> (.*)", out).groups()
    assert after == "'Paris.'" != before
    # the fine-tuning run's metrics, plotted inline (launcher.cli.metrics_view through the kernel's display)
    plotted = [c for c in nb.cells if c.cell_type == "code" and "plot([fine_tuning])" in c.source]
    assert len(plotted) == 1 and any("image/png" in o.get("data", {}) for o in plotted[0].outputs)
    stamp = re.compile(r"-\d{4}(-\d\d){5}-\d{3}$")  # make_job_name's timestamp
    sweep_stamp = re.compile(r"-\d{6}-\d{6}(?=-\d{3}$)")  # a sweep's name: base_tuning_job_name-yymmdd-HHMMSS
    jobs = sorted(sweep_stamp.sub("", stamp.sub("", p.name)) for p in (tmp_path / "home" / "jobs").iterdir())
    assert jobs == ["walkthrough-chat", "walkthrough-cp2", "walkthrough-finetune", "walkthrough-lr-001",
                    "walkthrough-lr-001", "walkthrough-lr-002", "walkthrough-lr-002", "walkthrough-no-cp"]
    # the short local sweep: its two trials, the best checked against their own metrics in the notebook;
    # run again, another sweep of its own name
    best = re.compile(r"best trial: (walkthrough-lr-\d{6}-\d{6})-00[12] lr = ")
    names = [best.search(text) for text in (first, text_of(again))]
    assert all(names) and names[0].group(1) != names[1].group(1)


def test_outside_the_repository_the_first_cell_says_what_to_set(tmp_path):
    """Started elsewhere, the notebook names SMLAUNCH_ROOT and SMLAUNCH_NOTEBOOK_WORK (it raised a bare
    StopIteration); given them, it runs there (the control)."""
    import os
    import subprocess
    import sys

    nb = nbformat.read(ROOT / "notebooks" / "walkthrough.ipynb", as_version=4)
    first = next(c.source for c in nb.cells if c.cell_type == "code")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMLAUNCH_")}

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", first], cwd=tmp_path, env={**env, **extra}, capture_output=True,
                              text=True, timeout=120, check=False)

    outside = run()
    assert outside.returncode == 1 and "StopIteration" not in outside.stderr
    assert (f"RuntimeError: {tmp_path} (nor any directory above it) is not smlaunch's checkout (no "
            "entrypoints/train.py): start the notebook in the repository or in notebooks/, or set SMLAUNCH_ROOT to "
            "the repository (and SMLAUNCH_NOTEBOOK_WORK to where it may write; default "
            "<repository>/build/notebook)") in outside.stderr
    wrong = run(SMLAUNCH_ROOT=str(tmp_path))
    assert f"RuntimeError: SMLAUNCH_ROOT={tmp_path} is not smlaunch's checkout" in wrong.stderr
    given = run(SMLAUNCH_ROOT=str(ROOT), SMLAUNCH_NOTEBOOK_WORK=str(tmp_path / "work"))
    assert given.returncode == 0, given.stderr
    assert given.stdout == f"repository: {ROOT} \nwork directory: {tmp_path / 'work'}\n"
