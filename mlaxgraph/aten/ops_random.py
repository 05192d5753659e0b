"""The ``aten`` family's random operators (ATen's signatures): ``torch.rand``,
``randn``, ``randint``, ``randperm`` (and their ``_like`` forms), ``bernoulli``,
``multinomial``, and ``nn.AlphaDropout`` / ``nn.FeatureAlphaDropout``.

They draw from the key ``apply`` is given (``rng=``), so their numbers follow the
distributions PyTorch's do but are not the numbers PyTorch's generator draws.
PyTorch draws ``torch.rand`` & co. in either mode, so these do too: in eval mode
(``inference_mode=True``) ``apply`` needs a key for them as well, and without one is
an ``mg.GraphError`` naming the operator (``EVERY_MODE``). The alpha dropouts draw in
train mode only (``train=True``), as PyTorch's."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .layer import DRAWS, EVERY_MODE, define
from .ops_table import dtype_of


def _float(dtype, like=None):
    return dtype_of(dtype, like if like is not None else jnp.float32)


def _rand(size, dtype=None, rng=None, **kw):
    return jax.random.uniform(rng, tuple(size), _float(dtype))


def _randn(size, dtype=None, rng=None, **kw):
    return jax.random.normal(rng, tuple(size), _float(dtype))


def _randint(low, high, size, dtype=None, rng=None, **kw):
    return jax.random.randint(rng, tuple(size), low, high, dtype_of(dtype, jnp.int32))


def _multinomial(probs, num_samples, replacement=False, rng=None, **kw):
    """Categories drawn by weight: with ``replacement`` each draw apart; without, the
    ``num_samples`` largest of the log weights plus Gumbel noise (the distribution of
    drawing one at a time without putting back)."""
    logits = jnp.log(probs.astype(jnp.float32))
    if replacement:
        draws = jax.random.categorical(rng, logits, shape=(num_samples,) + probs.shape[:-1])
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int32)
    noisy = logits + jax.random.gumbel(rng, probs.shape)
    return jax.lax.top_k(noisy, num_samples)[1].astype(jnp.int32)


_ALPHA = 1.7580993408473766  # SELU's -scale * alpha, as PyTorch's alpha dropout takes it


def _alpha_dropout(x, p, train, rng, shape):
    """PyTorch's alpha dropout: the kept values scaled by ``a``, the dropped set to
    ``-alpha * a``, plus ``alpha * a * p``, where ``a = 1 / sqrt((alpha**2 p + 1)(1 - p))``
    (keeping SELU's mean and variance); the input itself without ``train``."""
    if not train or not p or rng is None:
        return x
    if p >= 1:
        return x * jnp.zeros((), x.dtype)
    a = 1.0 / (((_ALPHA * _ALPHA * p + 1) * (1 - p)) ** 0.5)
    keep = jax.random.bernoulli(rng, 1.0 - p, shape).astype(x.dtype)
    return x * (keep * a) + ((keep - 1) * (_ALPHA * a) + _ALPHA * a * p)


EVERY_MODE.update({
    "aten.rand.default", "aten.rand_like.default", "aten.randn.default", "aten.randn_like.default",
    "aten.randint.low", "aten.randint.default", "aten.randint_like.default",
    "aten.randint_like.low_dtype", "aten.randperm.default", "aten.bernoulli.default",
    "aten.bernoulli.p", "aten.multinomial.default"})
define("aten.rand.default", flops="none", random=True)(_rand)
define("aten.randn.default", flops="none", random=True)(_randn)
define("aten.rand_like.default", flops="none", random=True)(
    lambda x, dtype=None, rng=None, **kw: _rand(x.shape, None, rng).astype(_float(dtype, x.dtype)))
define("aten.randn_like.default", flops="none", random=True)(
    lambda x, dtype=None, rng=None, **kw: _randn(x.shape, None, rng).astype(_float(dtype, x.dtype)))
define("aten.randint.low", flops="none", random=True)(_randint)
define("aten.randint.default", flops="none", random=True)(
    lambda high, size, dtype=None, rng=None, **kw: _randint(0, high, size, dtype, rng))
define("aten.randint_like.default", flops="none", random=True)(
    lambda x, high, dtype=None, rng=None, **kw: _randint(0, high, x.shape, None, rng).astype(
        dtype_of(dtype, x.dtype)))
define("aten.randint_like.low_dtype", flops="none", random=True)(
    lambda x, low, high, dtype=None, rng=None, **kw: _randint(low, high, x.shape, None, rng).astype(
        dtype_of(dtype, x.dtype)))
define("aten.randperm.default", flops="none", random=True)(
    lambda n, dtype=None, rng=None, **kw: jax.random.permutation(rng, n).astype(
        dtype_of(dtype, jnp.int32)))
define("aten.bernoulli.default", flops="none", random=True)(
    lambda x, generator=None, rng=None: jax.random.bernoulli(rng, x).astype(x.dtype))
define("aten.bernoulli.p", flops="none", random=True)(
    lambda x, p, generator=None, rng=None: jax.random.bernoulli(rng, p, x.shape).astype(x.dtype))
define("aten.multinomial.default", flops="none", random=True)(_multinomial)
define("aten.alpha_dropout.default", "aten.alpha_dropout_.default", flops="elementwise",
       random=True)(lambda x, p, train, rng=None: _alpha_dropout(x, p, train, rng, x.shape))
define("aten.feature_alpha_dropout.default", "aten.feature_alpha_dropout_.default",
       flops="elementwise", random=True)(
    lambda x, p, train, rng=None: _alpha_dropout(x, p, train, rng, x.shape[:2] + (1,) * (x.ndim - 2)))


def _drops(args, kwargs) -> bool:
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.0)
    train = args[2] if len(args) > 2 else kwargs.get("train")
    return train is True and isinstance(p, (int, float)) and p > 0


for _name in ("aten.alpha_dropout.default", "aten.alpha_dropout_.default",
              "aten.feature_alpha_dropout.default", "aten.feature_alpha_dropout_.default"):
    DRAWS[_name] = _drops
