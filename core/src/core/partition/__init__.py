"""Partition math of tensor parallelism: which slice of each weight a rank keeps
(:mod:`core.partition.sharding`) and the collectives a split model calls
(:mod:`core.partition.tensor_parallel`). Pure functions of the model config and a rank;
the loader and the models build on it, the worker processes live in :mod:`core.distributed`."""
