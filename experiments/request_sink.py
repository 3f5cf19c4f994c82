"""Finished requests turned into columnar rows as they finish, so a long run keeps no Request objects."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from simcore.metrics import request_frame
from simcore.request import Request


class RequestSink:
    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.num_rows = 0

    def add(self, requests: Sequence[Request]) -> None:
        if requests:
            self.tables.append(pa.Table.from_pandas(request_frame(requests), preserve_index=False))
            self.num_rows += len(requests)

    def frame(self) -> pd.DataFrame:
        """Every row, in request-id order."""
        if not self.tables:
            return request_frame([])
        table = pa.concat_tables(self.tables, promote_options="permissive")
        self.tables = [table]
        return table.sort_by("request_id").to_pandas()
