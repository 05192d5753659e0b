"""Training what you composed: a jitted optax train step built from a compiled model,
a fit loop, mixed precision with dynamic loss scaling, and checkpoints.

Example:
  >>> import jax, numpy as np, optax, mlaxgraph as mg
  >>> from mlaxgraph.examples import mlp
  >>> trainer = mg.train.Trainer(mg.compile(mlp(4, (16,), 2)), optax.adam(1e-2),
  ...                            metrics=("accuracy",))
  >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
  >>> y = (x[:, 0] > 0).astype("int32")
  >>> ts, history = trainer.fit(trainer.init(jax.random.key(0)), (x, y), epochs=20,
  ...                           batch_size=16, progress=False)
  >>> history["accuracy"][-1] > 0.9
  True
"""

from ..io.checkpoint import CheckpointManager
from .fit import evaluate, fit
from .loss_scale import DynamicLossScale, all_finite
from .objectives import LOSSES, METRICS
from .state import TrainState
from .trainer import Trainer

__all__ = ["Trainer", "TrainState", "DynamicLossScale", "CheckpointManager", "fit",
           "evaluate", "all_finite", "LOSSES", "METRICS"]
