"""The SageMaker training toolkit's part: the /opt/ml contract, the bootstrap that starts torchrun,
rank logs and failure reports."""
