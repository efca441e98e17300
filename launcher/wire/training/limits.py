"""Bounds on what a job may ask for: SageMaker's request limits, and the sizes smlaunch checks
its arithmetic against.

The request limits are those of botocore's service model for CreateTrainingJob
(botocore/data/sagemaker/2017-07-24/service-2.json): the `HyperParameters` map (max 100 entries,
`HyperParameterKey` max 256, `HyperParameterValue` max 2500 characters), `TrainingEnvironmentMap`
(max 100, `TrainingEnvironmentKey` max 512, `TrainingEnvironmentValue` max 512), `TagList`
(max 50, `TagKey` 1-128, `TagValue` max 256). SageMaker refuses a request beyond them only after
the code is uploaded; validation refuses it first, in local mode too, so a job that runs here
runs there.
"""

from __future__ import annotations

HYPERPARAMETERS_MAX = 100
HYPERPARAMETER_KEY_MAX = 256
HYPERPARAMETER_VALUE_MAX = 2500  # of the value as sent: json.dumps'ed, as the SDK sends it
ENVIRONMENT_MAX = 100
ENVIRONMENT_KEY_MAX = 512
ENVIRONMENT_VALUE_MAX = 512
TAGS_MAX = 50
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
# TagKey and TagValue's pattern: letters, separators, digits and _.:/=+-@
TAG_PATTERN = r"^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$"
# KeepAlivePeriodInSeconds (ResourceConfig and UpdateTrainingJob's ResourceConfigForUpdate): min 0,
# max 21600 (6 hours) in botocore's model and AWS's API reference; the developer guide's warm-pool
# page still says 3600 (docs/sagemaker-warm-pools.md). tests/unit/test_warm_pools.py reads the model.
KEEP_ALIVE_MAX = 21600

# CreateTrainingJob's InstanceCount has no maximum in the API (botocore: TrainingInstanceCount,
# min 0); accounts' service quotas set the real one. 4096 hosts (32768 GPUs of p5) is beyond any
# training job's, and bounds every rank computation (the divisors of the world).
MAX_INSTANCE_COUNT = 4096
# More than any instance has accelerators (16) or a CPU instance has vCPUs (192).
MAX_PROCESSES_PER_HOST = 256
MAX_WORLD = MAX_INSTANCE_COUNT * MAX_PROCESSES_PER_HOST  # so no parallel degree can exceed it
# A model or batch dimension: a tensor dimension (int32, as CUDA kernels index), so the
# planner's products of them stay within float range.
MAX_DIMENSION = 2**31 - 1
