"""What one ``ebb predict`` run is: every setting, its default and meaning, in one place
(the command's flags and ``--help`` are generated from these fields, as ``ebb train``'s are
from the job spec; the AWS Predict execution's input is the same fields)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ebb.spec import PrepareSpec

_SKIP = PrepareSpec.model_fields["skip_bad_rows"]  # one flag, one default, as `ebb prepare`'s


class PredictSpec(BaseModel):
    """An ``ebb predict`` run."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str = Field(description="the trained run: its folder or s3://bucket/prefix (model.npz and model.json)")
    input: str | None = Field(None, description="rows to score: a file or s3://bucket/key")
    out: str = Field(description="where the output goes: a file or s3://bucket/key")
    recommend: int | None = Field(None, ge=1, description="top-K items per user instead of scoring rows")
    users: str = Field("all", description="with --recommend: a file of raw user ids (one a line), or all")
    include_seen: bool = Field(False, description="with --recommend: also items the user rated in training")
    with_labels: bool = Field(False, description="LR: keep the rows' labels, and print log-loss, accuracy and AUC")
    skip_bad_rows: bool = Field(_SKIP.default, description=_SKIP.description)
    workers: int = Field(1, ge=1, description="local processes the input (or the users) is split over")
    stack: str | None = Field(None, description="run on this deployed stack's Predict state machine instead")
    shards: int = Field(4, ge=1, description="with --stack: the pieces the Map scores at once")
