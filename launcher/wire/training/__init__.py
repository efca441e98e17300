"""The training a job asks for, as client and runtime both read it: the hyperparameters' schema and
the checks the runtime repeats, layout and degrees, model shapes, catalog facts, run settings.
Imports nothing of smlaunch outside launcher.wire (docs/architecture.md)."""
