"""What a training step whose loss or gradient norm is not finite does (`nonfinite_policy`), decided
once for validation and the runtime (container/resilience/nonfinite.py; docs/faults.md).

- fail: the job fails at that step, before its update (the default).
- skip: the step applies no update: neither the optimizer nor the learning-rate schedule steps,
  and the step's batch is spent (as Megatron-LM does with a step whose gradients overflowed; torchtitan
  checks the loss and the norm at the same place, before both steps, and stops).
- rollback: the job restarts from its newest checkpoint and trains past that step's batches.
`nonfinite_max` bounds how many non-finite steps skip and rollback tolerate in the whole run.
"""

from __future__ import annotations

FAIL, SKIP, ROLLBACK = "fail", "skip", "rollback"
NONFINITE_POLICIES = (FAIL, SKIP, ROLLBACK)
# A run that meets a fourth non-finite step is diverging, not meeting a bad batch now and then:
# stop and let a person look (a lower learning rate, the data) rather than skip on.
DEFAULT_NONFINITE_MAX = 3
