"""How the ops of a traced ``forward`` act on the member-leading layout.

Each tensor in a rewritten graph is either *batched* (a leading member dim, the
members' values stacked) or *static* (the same for every member: shapes,
constants). Rewrites, by kind of op:

- pointwise ops need nothing, except aligning the ranks of two batched operands
  (``[N, B, F] * [N, F]``: the member dims must meet, so the lower-rank one gets
  singleton dims after its member dim);
- ops taking a dim shift it by one (``flatten(1)`` is ``flatten(2)``, negative
  dims are unchanged); shape ops prepend the member dim; ``x.shape``,
  ``x.size(d)`` and ``x.dim()`` report the per-member values;
- anything else runs under ``torch.func.vmap`` for that op alone.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from .registry import BatchContext


def _words(text: str) -> list[str]:
    return text.split()


_POINTWISE_NAMES = _words(
    "add sub mul div true_divide floor_divide pow neg abs exp exp2 log log2 log10 log1p expm1 "
    "sqrt rsqrt sin cos tan tanh sigmoid relu silu erf erfc sign square reciprocal floor ceil "
    "round trunc frac fmod remainder clamp clip clamp_min clamp_max where maximum minimum lerp "
    "addcmul addcdiv masked_fill atan2 hypot nan_to_num isnan isinf logical_not logical_and "
    "logical_or logical_xor eq ne lt le gt ge float double half bfloat16 to type_as contiguous "
    "detach clone bool long int sinh cosh asin acos atan asinh acosh atanh softplus logit xlogy "
    "add_ sub_ mul_ div_ relu_ tanh_ sigmoid_ clamp_ neg_ exp_ masked_fill_ requires_grad_"
)

POINTWISE_METHODS = frozenset(_POINTWISE_NAMES)

POINTWISE_FUNCTIONS = frozenset(
    [getattr(torch, name) for name in _POINTWISE_NAMES if hasattr(torch, name)]
    + [getattr(torch.Tensor, name) for name in _POINTWISE_NAMES if hasattr(torch.Tensor, name)]
    + [
        getattr(F, name)
        for name in _words(
            "relu gelu silu elu celu selu leaky_relu softplus mish hardtanh relu6 sigmoid tanh "
            "hardswish hardsigmoid logsigmoid softsign tanhshrink threshold hardshrink "
            "softshrink relu_ elu_ leaky_relu_"
        )
    ]
    + [
        operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.pow, operator.neg, operator.pos, operator.abs, operator.mod, operator.eq,
        operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
        operator.or_, operator.xor, operator.invert, operator.iadd, operator.isub,
        operator.imul, operator.itruediv,
    ]
)  # fmt: skip

# Methods that also take their dims as varargs (``x.flip(0, 2)``, ``x.squeeze(0, 1)``).
VARARG_DIM_METHODS = frozenset(["flip", "squeeze"])

# name -> (position of the dim argument, keyword name, default when not given).
# A default of None means "every dim" (a reduction to one value per member),
# which depends on the rank: such calls run under vmap.
DIM_OPS = {
    "sum": (1, "dim", None), "mean": (1, "dim", None), "amax": (1, "dim", None),
    "amin": (1, "dim", None), "prod": (1, "dim", None), "std": (1, "dim", None),
    "var": (1, "dim", None), "logsumexp": (1, "dim", None), "argmax": (1, "dim", None),
    "argmin": (1, "dim", None), "all": (1, "dim", None), "any": (1, "dim", None),
    "max": (1, "dim", None), "min": (1, "dim", None), "nansum": (1, "dim", None),
    "count_nonzero": (1, "dim", None), "softmax": (1, "dim", None),
    "log_softmax": (1, "dim", None), "softmin": (1, "dim", None), "cumsum": (1, "dim", None),
    "cumprod": (1, "dim", None), "unsqueeze": (1, "dim", None), "squeeze": (1, "dim", None),
    "cat": (1, "dim", 0), "concat": (1, "dim", 0), "concatenate": (1, "dim", 0),
    "stack": (1, "dim", 0), "chunk": (2, "dim", 0), "split": (2, "dim", 0),
    "unbind": (1, "dim", 0), "narrow": (1, "dim", None), "select": (1, "dim", None),
    "index_select": (1, "dim", None), "gather": (1, "dim", None), "unflatten": (1, "dim", None),
    "topk": (2, "dim", -1), "sort": (1, "dim", -1), "argsort": (1, "dim", -1),
    "normalize": (2, "dim", 1), "glu": (1, "dim", -1), "flip": (1, "dims", None),
    "diff": (2, "dim", -1), "norm": (2, "dim", None), "median": (1, "dim", None),
}  # fmt: skip
TWO_DIM_OPS = {  # name -> the two dims' (position, keyword, default)
    "flatten": ((1, "start_dim", 0), (2, "end_dim", -1)),
    "transpose": ((1, "dim0", None), (2, "dim1", None)),
    "swapaxes": ((1, "axis0", None), (2, "axis1", None)),
    "swapdims": ((1, "dim0", None), (2, "dim1", None)),
    "movedim": ((1, "source", None), (2, "destination", None)),
}

# Functions acting on each sample of a [B, C, ...] batch alone: the members fold
# into the batch dim (``per_sample``).
PER_SAMPLE_FUNCTIONS = frozenset(
    getattr(F, name)
    for name in _words(
        "max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
        "adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d "
        "adaptive_max_pool3d lp_pool1d lp_pool2d interpolate upsample pad pixel_shuffle "
        "pixel_unshuffle"
    )
    if hasattr(F, name)
)

FUNCTION_NAMES: dict = {}
for _name in [*DIM_OPS, *TWO_DIM_OPS, "reshape", "permute", "matmul", "bmm", "mm"]:
    for _namespace in (torch, F):
        if hasattr(_namespace, _name):
            FUNCTION_NAMES[getattr(_namespace, _name)] = _name
    if hasattr(torch.Tensor, _name):
        FUNCTION_NAMES[getattr(torch.Tensor, _name)] = _name
FUNCTION_NAMES[operator.matmul] = "matmul"
FUNCTION_NAMES[F.linear] = "linear"
FUNCTION_NAMES[F.scaled_dot_product_attention] = "scaled_dot_product_attention"

RANDOM_NAMES = frozenset(
    _words(
        "rand randn randint randperm rand_like randn_like randint_like normal bernoulli poisson "
        "multinomial dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout "
        "rrelu uniform_ normal_ bernoulli_ exponential_ random_ cauchy_ log_normal_ geometric_"
    )
)
RANDOM_FUNCTIONS = frozenset(
    getattr(namespace, name)
    for namespace in (torch, F, torch.Tensor)
    for name in RANDOM_NAMES
    if hasattr(namespace, name)
)


def shift(dim):
    """A literal per-member dim (or tuple of dims) in the member-leading layout; None
    when it is not a literal."""
    if isinstance(dim, bool):
        return None
    if isinstance(dim, int):
        return dim + 1 if dim >= 0 else dim
    if (
        isinstance(dim, (tuple, list))
        and dim
        and all(isinstance(d, int) and not isinstance(d, bool) for d in dim)
    ):
        return type(dim)(d + 1 if d >= 0 else d for d in dim)
    return None


# ----------------------------------------------------------------- runtime helpers
def lead(value, leaves):
    """A static tensor as a batched one (the same value for every member)."""
    if isinstance(value, torch.Tensor):
        return value.expand(leaves[0].shape[0], *value.shape)
    return value


def member_shape(x):
    return x.shape[1:] if isinstance(x, torch.Tensor) else x.shape


def member_ndim(x):
    return x.dim() - 1


def member_size(x, dim=None):
    if dim is None:
        return x.shape[1:]
    return x.shape[dim + 1 if dim >= 0 else dim]


def member_numel(x):
    return x[0].numel() if x.shape[0] else 0


def _shape_args(shape: tuple) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], int):
        return tuple(shape[0])
    return shape


def view(x, *shape):
    return x.view(x.shape[0], *_shape_args(shape))


def reshape(x, *shape):
    return x.reshape(x.shape[0], *_shape_args(shape))


def _with_rank(x, rank: int):
    """``x`` with singleton dims after its member dim up to ``rank`` per member: expand
    and repeat prepend the dims they add, which must go after the member dim."""
    extra = rank - (x.dim() - 1)
    return x.view(x.shape[0], *(1,) * extra, *x.shape[1:]) if extra > 0 else x


def expand(x, *shape):
    shape = _shape_args(shape)
    return _with_rank(x, len(shape)).expand(x.shape[0], *shape)


def repeat(x, *shape):
    shape = _shape_args(shape)
    return _with_rank(x, len(shape)).repeat(1, *shape)


def permute(x, *dims):
    return x.permute(0, *[d + 1 if d >= 0 else d for d in _shape_args(dims)])


def getitem(x, index):
    if not isinstance(x, torch.Tensor):
        return x[index]
    if not isinstance(index, tuple):
        index = (index,)
    advanced = sum(1 for i in index if isinstance(i, (torch.Tensor, list)))
    if advanced > 1:  # numpy rules would move the indexed dims before the member dim
        return torch.func.vmap(lambda t: t[index])(x)
    return x[(slice(None), *index)]


def per_sample(function):
    """``function`` of a ``[B, C, ...]`` batch, run on the members folded into the batch."""

    def call(x, *args, **kwargs):
        out = function(x.flatten(0, 1), *args, **kwargs)
        if isinstance(out, tuple):  # (values, indices)
            return tuple(o.unflatten(0, x.shape[:2]) for o in out)
        return out.unflatten(0, x.shape[:2])

    call.__name__ = f"per_sample_{getattr(function, '__name__', 'op')}"
    return call


def aligned(function, flags, kwarg_flags=None):
    """``function`` on operands whose batched ones (``flags``, and ``kwarg_flags`` by
    keyword: ``x.clamp(min=self.low)``) get equal ranks."""
    kwarg_flags = kwarg_flags or {}
    batched_keys = tuple(key for key, batched in kwarg_flags.items() if batched)

    def call(*args, **kwargs):
        rank = 0
        for value, batched in zip(args, flags):
            if isinstance(value, torch.Tensor):
                rank = max(rank, value.dim() - 1 if batched else value.dim())
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                rank = max(rank, value.dim() - 1 if kwarg_flags.get(key) else value.dim())
        args = [_pad(value, rank) if batched else value for value, batched in zip(args, flags)]
        for key in batched_keys:
            if key in kwargs:
                kwargs[key] = _pad(kwargs[key], rank)
        return function(*args, **kwargs)

    call.__name__ = f"aligned_{getattr(function, '__name__', 'op')}"
    return call


def _pad(value, rank: int):
    """A batched tensor with singleton dims after its member dim, up to ``rank`` per member."""
    if isinstance(value, torch.Tensor) and value.dim() - 1 < rank:
        return value.view(value.shape[0], *(1,) * (rank + 1 - value.dim()), *value.shape[1:])
    return value


def matmul(a, b, a_batched: bool, b_batched: bool):
    # Batched [N, ..., n, k] @ [N, ..., k, m] of one rank is a batched matmul; a
    # static matrix broadcasts; other rank combinations go through vmap.
    if a_batched and b_batched:
        direct = a.dim() == b.dim() and a.dim() >= 3
    elif a_batched:
        direct = b.dim() <= 2
    else:
        direct = a.dim() <= 2 and b.dim() >= 3
    if direct:
        return torch.matmul(a, b)
    dims = (0 if a_batched else None, 0 if b_batched else None)
    return torch.func.vmap(torch.matmul, in_dims=dims)(a, b)


def linear(x, weight, bias=None):
    """``F.linear`` with stacked ``weight`` ``[N, out, in]`` (and ``bias``)."""
    shape = x.shape
    flat = x.reshape(shape[0], -1, shape[-1]) if x.dim() != 3 else x
    if bias is None:
        out = torch.bmm(flat, weight.mT)
    else:
        out = torch.baddbmm(bias.unsqueeze(1), flat, weight.mT)
    return out if x.dim() == 3 else out.view(*shape[:-1], out.shape[-1])


def vmapped_op(function, arg_dims: tuple, kwarg_dims: dict, context: BatchContext):
    """``function`` run once per member under vmap.

    ``arg_dims`` / ``kwarg_dims``: vmap's ``in_dims`` for each argument, as a tree
    matching it (``(None, 0)`` for ``x[(static_rows, batched_actions)]``): 0 for
    each batched tensor, None for the rest.
    """
    names = tuple(kwarg_dims)

    def call(*args, **kwargs):
        count = len(args)
        mapped_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
        keys = tuple(mapped_kwargs)

        def member(*values):
            return function(*values[:count], **dict(zip(keys, values[count:])), **kwargs)

        values = (*args, *mapped_kwargs.values())
        dims = (*arg_dims[:count], *(kwarg_dims[k] for k in keys))
        dims = tuple(map(_fit_dims, values, dims))
        return torch.func.vmap(member, in_dims=dims, randomness=context.randomness)(*values)

    call.__name__ = f"vmapped_{getattr(function, '__name__', 'op')}"
    return call


def _fit_dims(value, dims):
    """``dims`` with None at the non-tensor leaves of ``value`` (a batched node may hold
    a tuple such as ``(output, None)``)."""
    if isinstance(value, torch.Tensor) or dims is None:
        return dims
    if isinstance(value, (tuple, list)):
        if isinstance(dims, (tuple, list)):
            return type(value)(map(_fit_dims, value, dims))
        return type(value)(_fit_dims(v, dims) for v in value)
    if isinstance(value, dict):
        if isinstance(dims, dict):
            return {k: _fit_dims(v, dims.get(k)) for k, v in value.items()}
        return {k: _fit_dims(v, dims) for k, v in value.items()}
    return None


def method(name: str):
    """``x.name(*args)`` as a function (for ops rewritten to helpers)."""

    def call(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    call.__name__ = name
    return call
