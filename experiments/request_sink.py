"""Finished requests turned into columnar rows as they finish, so a long run keeps no Request objects."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from simcore.metrics import request_columns, request_frame
from simcore.request import Request


class RequestSink:
    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.num_rows = 0
        self._frame: pd.DataFrame | None = None

    def add(self, requests: Sequence[Request]) -> None:
        if self._frame is not None:
            raise RuntimeError("rows added after the sink's frame was taken")
        if requests:
            self.tables.append(pa.table(request_columns(requests)))
            self.num_rows += len(requests)

    def frame(self) -> pd.DataFrame:
        """Every row, in request-id order (the sink is closed: no more rows)."""
        if self._frame is None:
            if not self.tables:
                self._frame = request_frame([])
            else:
                table = pa.concat_tables(self.tables, promote_options="permissive").sort_by("request_id")
                self.tables = []
                # Arrow buffers are released column by column as pandas takes them over.
                self._frame = table.to_pandas(self_destruct=True, split_blocks=True)
                del table
        return self._frame
