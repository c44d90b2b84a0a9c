"""Batched recurrent layers: ``nn.RNN``, ``nn.GRU``, ``nn.LSTM`` and their cells.

torch has no batching rule for its fused recurrent kernels (``aten::gru``,
``aten::lstm``, ``aten::lstm_cell``), so ``vmap`` cannot run them at all. Here
every member runs at once: the input gates of a whole sequence are one
``baddbmm`` over the members, then each time step is one ``baddbmm`` for the
hidden gates and a few pointwise ops, for all members together. The gate
formulas and their order are torch's own (``aten/src/ATen/native/RNN.cpp``):

- RNN: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)``;
- GRU: ``r, z = sigmoid(...)``, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
  ``h' = (h - n) * z + n``;
- LSTM: ``i, f, o = sigmoid(...)``, ``g = tanh(...)``, ``c' = f * c + i * g``,
  ``h' = o * tanh(c')`` (then ``W_hr h'`` with ``proj_size``).

Inputs and outputs keep each layer's own layouts (``batch_first``, unbatched
inputs, an optional initial state), with the member dim in front.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .layers import _random_error, row, transposed
from .registry import BatchContext, register_planner

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}


def _gates(x: torch.Tensor, weight_t: torch.Tensor, bias_row: torch.Tensor | None):
    """``x @ W^T + b`` per member: ``x`` ``[N, R, in]``, the result ``[N, R, gates]``."""
    if bias_row is None:
        return torch.bmm(x, weight_t)
    return torch.baddbmm(bias_row, x, weight_t)


def _cell(mode: str):
    """The update of one time step: ``update(input gates, hidden gates, h, c)``."""
    if mode == "RNN_TANH":
        return lambda gx, gh, h, c: (torch.tanh(gx + gh), None)
    if mode == "RNN_RELU":
        return lambda gx, gh, h, c: (torch.relu(gx + gh), None)
    if mode == "GRU":

        def gru(gx, gh, h, c):
            x_r, x_z, x_n = gx.chunk(3, -1)
            h_r, h_z, h_n = gh.chunk(3, -1)
            reset = torch.sigmoid(x_r + h_r)
            update = torch.sigmoid(x_z + h_z)
            new = torch.tanh(x_n + reset * h_n)
            return (h - new) * update + new, None

        return gru

    def lstm(gx, gh, h, c):
        i, f, g, o = (gh + gx).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    return lstm


class _Weights:
    """Where one layer and direction's tensors are in the extended leaves."""

    __slots__ = ("b_hh", "b_ih", "w_hh", "w_hr", "w_ih")

    def __init__(self, slots: dict, context: BatchContext, suffix: str) -> None:
        def derived(function, name):
            position = slots.get(name + suffix)
            return None if position is None else context.derived(function, position)

        self.w_ih = derived(transposed, "weight_ih")
        self.w_hh = derived(transposed, "weight_hh")
        self.b_ih = derived(row, "bias_ih")
        self.b_hh = derived(row, "bias_hh")
        self.w_hr = derived(transposed, "weight_hr")

    def get(self, leaves: tuple) -> tuple:
        def read(position):
            return None if position is None else leaves[position]

        return (read(self.w_ih), read(self.w_hh), read(self.b_ih), read(self.b_hh),
                read(self.w_hr))  # fmt: skip


def _dims_error(module: nn.Module, expected: str, got: int) -> ValueError:
    return ValueError(
        f"{type(module).__name__}: Expected input to be {expected} per member, got {got}D "
        f"instead (the ensemble adds the member dim in front)."
    )


def _check_input(module: nn.Module, x: torch.Tensor) -> None:
    if x.shape[-1] != module.input_size:
        raise RuntimeError(
            f"{type(module).__name__}: input.size(-1) must be equal to input_size. Expected "
            f"{module.input_size}, got {x.shape[-1]}."
        )


def _state(module: nn.Module, state: Any, expected: tuple, at: int, unbatched: bool, what: str):
    """A given initial state in the layout of the steps (member dim first, the batch dim at
    ``at``), once its shape per member is the one torch's layer expects (``expected``,
    for a batched input); ``None`` stays ``None``."""
    if state is None:
        return None
    want = expected[: at - 1] + expected[at:] if unbatched else expected
    got = tuple(state.shape[1:]) if isinstance(state, torch.Tensor) else None
    if got != want:
        shown = list(got) if got is not None else type(state).__name__
        raise RuntimeError(
            f"{type(module).__name__}: Expected {what} size {want}, got {shown} (per member: "
            f"the ensemble adds the member dim in front)."
        )
    return state.unsqueeze(at) if unbatched else state


def _pair(module: nn.Module, hx: Any) -> tuple:
    if hx is None:
        return None, None
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise RuntimeError(
            f"{type(module).__name__}: expected the state as a tuple (h, c), got "
            f"{type(hx).__name__}."
        )
    return hx[0], hx[1]


def _zeros(x: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=x.dtype, device=x.device)


@register_planner(nn.RNN, nn.GRU, nn.LSTM)
def _recurrent(module: nn.Module, slots: dict, context: BatchContext):
    mode = module.mode
    if mode not in _GATES:
        return None
    update = _cell(mode)
    layers, directions = module.num_layers, 2 if module.bidirectional else 1
    hidden = module.hidden_size
    out_size = module.proj_size if getattr(module, "proj_size", 0) > 0 else hidden
    weights = [
        [_Weights(slots, context, f"_l{layer}{'_reverse' if d else ''}") for d in range(directions)]
        for layer in range(layers)
    ]
    is_lstm = mode == "LSTM"

    def run_direction(seq, tensors, h, c, reverse):
        w_ih, w_hh, b_ih, b_hh, w_hr = tensors
        n, batch, steps = seq.shape[0], seq.shape[1], seq.shape[2]
        gx = _gates(seq.reshape(n, batch * steps, seq.shape[3]), w_ih, b_ih)
        gx = gx.view(n, batch, steps, gx.shape[-1])
        outputs = [None] * steps
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            h, c = update(gx[:, :, t], _gates(h, w_hh, b_hh), h, c)
            if w_hr is not None:
                h = torch.bmm(h, w_hr)
            outputs[t] = h
        return torch.stack(outputs, 2), h, c

    def step(leaves, input, hx=None):
        if not isinstance(input, torch.Tensor):
            raise TypeError(
                f"Ensemble: {type(module).__name__} runs batched over the members on padded "
                f"tensors only, got {type(input).__name__} (a PackedSequence cannot carry a "
                f"member dim). Pad the sequences and pass lengths to your own masking."
            )
        if input.dim() not in (3, 4):
            raise _dims_error(module, "2D or 3D", input.dim() - 1)
        unbatched = input.dim() == 3
        seq = (
            input.unsqueeze(1)
            if unbatched
            else input
            if module.batch_first
            else input.transpose(1, 2)
        )
        _check_input(module, seq)
        n, batch = seq.shape[0], seq.shape[1]
        h0, c0 = _pair(module, hx) if is_lstm else (hx, None)
        states = layers * directions
        h0 = _state(module, h0, (states, batch, out_size), 2, unbatched, "hidden")
        c0 = _state(module, c0, (states, batch, hidden), 2, unbatched, "cell")
        if h0 is None:
            h0 = _zeros(seq, n, layers * directions, batch, out_size)
        if is_lstm and c0 is None:
            c0 = _zeros(seq, n, layers * directions, batch, hidden)
        h_n, c_n = [], []
        for layer in range(layers):
            outputs = []
            for d in range(directions):
                index = layer * directions + d
                c = None if c0 is None else c0[:, index]
                tensors = weights[layer][d].get(leaves)
                out, h, c = run_direction(seq, tensors, h0[:, index], c, d == 1)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            seq = outputs[0] if directions == 1 else torch.cat(outputs, -1)
            if layer < layers - 1 and module.training and module.dropout > 0:
                seq = _dropout(seq, module.dropout, context)
        output = seq.squeeze(1) if unbatched else seq if module.batch_first else seq.transpose(1, 2)
        h_last = torch.stack(h_n, 1)
        if unbatched:
            h_last = h_last.squeeze(2)
        if not is_lstm:
            return output, h_last
        c_last = torch.stack(c_n, 1)
        return output, (h_last, c_last.squeeze(2) if unbatched else c_last)

    return step


def _dropout(x: torch.Tensor, p: float, context: BatchContext) -> torch.Tensor:
    """The dropout between stacked layers, with the ensemble's ``randomness``."""
    if context.randomness == "different":
        return F.dropout(x, p, True)
    if context.randomness == "same":  # one mask for every member, as vmap's "same"
        return x * F.dropout(torch.ones_like(x[0]), p, True)
    raise _random_error()


@register_planner(nn.RNNCell, nn.GRUCell, nn.LSTMCell)
def _recurrent_cell(module: nn.Module, slots: dict, context: BatchContext):
    if isinstance(module, nn.RNNCell):
        mode = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}.get(module.nonlinearity)
        if mode is None:
            return None
    else:
        mode = "GRU" if isinstance(module, nn.GRUCell) else "LSTM"
    update = _cell(mode)
    w = _Weights(slots, context, "")
    hidden = module.hidden_size
    is_lstm = mode == "LSTM"

    def step(leaves, input, hx=None):
        if input.dim() not in (2, 3):
            raise _dims_error(module, "1D or 2D", input.dim() - 1)
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else input
        _check_input(module, x)
        h, c = _pair(module, hx) if is_lstm else (hx, None)
        h = _state(module, h, (x.shape[1], hidden), 1, unbatched, "hidden")
        c = _state(module, c, (x.shape[1], hidden), 1, unbatched, "cell")
        if h is None:
            h = _zeros(x, x.shape[0], x.shape[1], hidden)
        if is_lstm and c is None:
            c = _zeros(x, x.shape[0], x.shape[1], hidden)
        w_ih, w_hh, b_ih, b_hh, _ = w.get(leaves)
        h, c = update(_gates(x, w_ih, b_ih), _gates(h, w_hh, b_hh), h, c)
        if unbatched:
            h = h.squeeze(1)
            c = None if c is None else c.squeeze(1)
        return (h, c) if is_lstm else h

    return step
