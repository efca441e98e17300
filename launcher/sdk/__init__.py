"""The SageMaker SDK faces: the v2 `PyTorch` estimator and the v3 `ModelTrainer` with their objects."""
