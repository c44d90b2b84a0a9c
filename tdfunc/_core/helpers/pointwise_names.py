"""The names of the element-wise torch methods that containers offer leaf by leaf."""

from __future__ import annotations

UNARY = [
    "abs",
    "acos",
    "asin",
    "atan",
    "ceil",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "erfinv",
    "exp",
    "expm1",
    "floor",
    "frac",
    "lgamma",
    "log",
    "log10",
    "log1p",
    "log2",
    "neg",
    "reciprocal",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
]


PREDICATES = ("isnan", "isfinite", "isinf", "isposinf", "isneginf", "isreal")
