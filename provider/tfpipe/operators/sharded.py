"""Sharded prep on a Docker engine: ``prep_shard`` tasks (one per slice of the input files, mapped)
and the ``prep_merge`` task after them, used when ``data.shards`` is above 1.

Kept apart from :mod:`tfpipe.operators.docker` so that a pipeline without shards, most of them,
never makes these classes when its DAG file is parsed.
"""

from __future__ import annotations

from typing import Any

from tfpipe.operators.docker import TfpipeStageOperator


class PrepShardOperator(TfpipeStageOperator):
    """Prep one slice of the input files (``data.shards`` > 1); mapped over the slice indexes.

    :param shard_index: the slice, 0 .. ``data.shards`` - 1 (``.expand(shard_index=range(n))``).
    :param engine_from_shard_list: ``docker_url`` is one of the pipeline's ``shard_docker_urls``; a
        ``tcp://`` one then presents the deployment's ``[tfpipe] tls_*`` files.
    """

    stage = "prep_shard"

    def __init__(self, *, shard_index: int, engine_from_shard_list: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard_index = shard_index
        self.engine_from_shard_list = engine_from_shard_list


class PrepMergeOperator(TfpipeStageOperator):
    """Merge the prep_shard parts into the one data set train and evaluate read (cached)."""

    stage = "prep_merge"


SHARDED_OPERATORS: dict[str, type[TfpipeStageOperator]] = {
    op.stage: op for op in (PrepShardOperator, PrepMergeOperator)
}
