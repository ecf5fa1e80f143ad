"""What a training run returns, whichever model trained (:class:`TrainResult`): in a module of its
own so that the trainers (:mod:`.train`, :mod:`.dlrm`) need not import each other."""
from __future__ import annotations

import dataclasses

from embnic.client_lib.batch import dedup_ratio


@dataclasses.dataclass
class TrainResult:
    """Outcome of a training run (:func:`~embnic.testbed.training.train.train`, the FM, and
    :func:`~embnic.testbed.training.dlrm.train_dlrm`, the DLRM).

    Attributes:
        loss: per-step training loss (mean BCE), length ``steps``.
        auc: ROC AUC on the evaluation rows (None without eval data).
        eval_loss: mean BCE on the evaluation rows.
        ids, unique_ids: sparse ids seen and unique (per table, per batch) over all steps.
        step_time_s: wall time per step.
        params: the trained dense parameters (the FM's :class:`~embnic.testbed.training.train.DenseParams`,
            the DLRM's ``state_dict()``).
    """

    loss: list
    auc: float | None
    eval_loss: float | None
    ids: int
    unique_ids: int
    step_time_s: list
    params: object

    @property
    def dedup_ratio(self) -> float:
        """unique ids / all ids over the run's batches (:func:`~embnic.client_lib.batch.dedup_ratio`)."""
        return dedup_ratio(self.unique_ids, self.ids)
