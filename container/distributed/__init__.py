"""Parallelisms applied to an unchanged model: the mesh and process groups (runtime), FSDP2 and
activation checkpointing (parallelize), tensor, context, expert and pipeline parallelism, offload."""
