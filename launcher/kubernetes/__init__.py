"""The Kubernetes engine (issue 42, section 2): what a job becomes on a cluster, a Kubeflow Trainer
TrainJob queued by Kueue. Not yet a backend: launcher.config.backend_table has no row for it."""
