"""PyTorch's projected-LSTM loop, reached through the door `elmo_tf.layers.backends` (`projected_lstms`): the values of
`ops_recurrence.ops_lstm_scan` (to float32 rounding) in plain PyTorch ops, differentiable by autograd.

What it does differently from the `keras.ops` loop (whose PyTorch `scan` is a Python loop of Keras ops over stacked
tensors; see docs/backends.md for the profile):
- no copy of the weights per call: each direction multiplies by its own stored kernels (`W^T`, the layout
  `torch.nn.functional.linear` takes), where the `keras.ops` loop stacks the transposed kernels of both directions
  into new tensors at every call (48 MB per direction and layer of the original model);
- the input gates `x W_x + b` of all steps are one `addmm` per direction before the loop; each step adds its
  recurrent product in the same `addmm`;
- without autograd, on a left-aligned mask (each row real for its first steps: ELMo's sentences) and without
  `resets` (`packed_scan`), the rows sorted by length, each step multiplies only the rows still running (as
  AllenNLP's LSTM does), the input gates are computed for the real positions only, and the gate math and the state
  are updated in place: a batch in corpus order (rows padded to their longest, about half padding at batch 32)
  costs about its real tokens;
- otherwise (`masked_scan`: autograd, `resets`, any mask) every row runs at every step up to the last one holding a
  real token, and a step whose rows are all real skips the masking `where`s.

Imported only on the PyTorch backend.
"""

import torch
from torch.utils.weak import WeakIdKeyDictionary

from elmo_tf.layers import backends
from elmo_tf.layers.lstm_constants import FORGET_BIAS

# oneDNN's linear on a kernel reordered once into its blocked layout (what torch.compile's CPU backend runs for a
# frozen Linear): on the few rows of one step it multiplies far faster than `addmm` on MKL (measured, 2 threads, AMD
# EPYC AVX2: rows 32 x 512 by the 16,384 gates 130 against 72 GFLOP/s; rows 8: 84 against 27; the projection
# 32 x 4096 by 512: 144 against 102). Used for the per-step matmuls only with autograd off, on float32 CPU kernels
# where this PyTorch has the ops; the reordered copy is remade when its kernel is written (`_version`) or replaced.
_ONEDNN_LINEAR = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)
_REORDERED = WeakIdKeyDictionary()  # kernel -> (its _version, its data_ptr, the reordered copy); keyed by identity


def _reordered(kernel):
    """oneDNN's reordered copy of `kernel` `(out, in)`, made once per kernel and version; None where it does not
    apply (autograd on, not float32, not on the CPU, or no oneDNN linear in this PyTorch)."""
    if torch.is_grad_enabled() or not _ONEDNN_LINEAR or kernel.device.type != "cpu" or kernel.dtype != torch.float32:
        return None
    key = (kernel._version, kernel.data_ptr())
    entry = _REORDERED.get(kernel)
    if entry is None or entry[:2] != key:
        entry = (*key, torch.ops.mkldnn._reorder_linear_weight(kernel.detach()))
        _REORDERED[kernel] = entry
    return entry[2]


def _times(x, kernel, reordered):
    """`x @ kernel^T`, by oneDNN's linear when `reordered` is `kernel`'s reordered copy."""
    if reordered is None or not len(x):
        return torch.mm(x, kernel.t())
    return torch.ops.mkldnn._linear_pointwise(x, reordered, None, "none", [], "")


def _plus_times(rows, x, kernel, reordered):
    """`rows + x @ kernel^T` (a step's input gates plus its recurrent product)."""
    if reordered is None or not len(x):
        return torch.addmm(rows, x, kernel.t())
    return _times(x, kernel, reordered).add_(rows)


def _clip_(x, clip):
    return x.clamp_(-clip, clip) if clip else x


def _clip(x, clip):
    return x.clamp(-clip, clip) if clip else x


def _step(z, c, projection_kernel, reordered, cell_clip, proj_clip):
    """One TF1 `LSTMCell(num_proj=...)` step from the gates `z` `(batch, 4 * units)` (i, j, f, o): the new `c` and
    the projected output `m` (`reordered`: the projection kernel's oneDNN copy, or None)."""
    i, j, f, o = z.chunk(4, dim=1)
    c = _clip(torch.sigmoid(f + FORGET_BIAS) * c + torch.sigmoid(i) * torch.tanh(j), cell_clip)
    return c, _clip(_times(torch.sigmoid(o) * torch.tanh(c), projection_kernel, reordered), proj_clip)


def _left_aligned_lengths(mask):
    """Each row's number of real steps, where every row of `mask` `(time, batch)` is real for its first steps only
    (ELMo's sentences, and a batch padded after them); None otherwise."""
    lengths = mask.sum(dim=0)
    expected = torch.arange(mask.shape[0], device=mask.device)[:, None] < lengths[None, :]
    return lengths if torch.equal(mask, expected) else None


def lstm_scan(inputs, mask, input_kernels, biases, recurrent_kernels, projection_kernels, initial_c, initial_h,
              cell_clip=None, proj_clip=None, resets=None):  # fmt: skip
    """Runs D independent projected LSTMs over time: `ops_recurrence.ops_lstm_scan`'s arguments (float32 tensors, no
    `matmul_dtype`) and results. Without autograd, on a left-aligned mask and without `resets`, `packed_scan`: each
    step multiplies only the rows still running; otherwise `masked_scan`.
    """
    mask = mask.to(torch.bool)
    kernels = (input_kernels, biases, recurrent_kernels, projection_kernels)
    tensors = [*inputs, *initial_c, *initial_h, *(w for group in kernels for w in group)]
    if resets is None and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        lengths = _left_aligned_lengths(mask)
        if lengths is not None:
            return packed_scan(inputs, lengths, kernels, initial_c, initial_h, cell_clip, proj_clip)
    return masked_scan(inputs, mask, kernels, initial_c, initial_h, cell_clip, proj_clip, resets)


def packed_scan(inputs, lengths, kernels, initial_c, initial_h, cell_clip, proj_clip):
    """`lstm_scan` without autograd, on rows that are real for their first `lengths` steps: the rows sorted by length
    (longest first), step t multiplies the first `running[t]` of them only (what AllenNLP's LSTM does), the input
    gates of the real positions only in one `addmm` per direction, the state and the gate math updated in place."""
    input_kernels, biases, recurrent_kernels, projection_kernels = kernels
    steps, batch = inputs[0].shape[0], inputs[0].shape[1]
    order = torch.argsort(lengths, descending=True, stable=True)
    back = torch.argsort(order)
    sorted_lengths = lengths[order].tolist()  # one host read of the lengths
    running = [sum(n > t for n in sorted_lengths) for t in range(sorted_lengths[0] if batch else 0)]
    outs, cs, hs = [], [], []
    for d, x in enumerate(inputs):
        x = x[:, order]
        real = torch.cat([x[t, :n] for t, n in enumerate(running)]) if running else x[:0, 0]
        gates = torch.addmm(biases[d], real, input_kernels[d].t())  # (real positions, 4 * units), step-major
        c, h = initial_c[d][order].clone(), initial_h[d][order].clone()
        out = x.new_zeros((steps, batch, projection_kernels[d].shape[0]))
        recurrent, projection = _reordered(recurrent_kernels[d]), _reordered(projection_kernels[d])
        start = 0
        for t, n in enumerate(running):
            z = _plus_times(gates[start : start + n], h[:n], recurrent_kernels[d], recurrent)
            start += n
            i, j, f, o = z.chunk(4, dim=1)
            f.add_(FORGET_BIAS).sigmoid_()
            _clip_(c[:n].mul_(f).addcmul_(i.sigmoid_(), j.tanh_()), cell_clip)
            o.sigmoid_().mul_(torch.tanh(c[:n]))
            if projection is None:
                torch.mm(o, projection_kernels[d].t(), out=h[:n])
            else:
                h[:n] = _times(o, projection_kernels[d], projection)
            _clip_(h[:n], proj_clip)
            out[t, :n] = h[:n]
        outs.append(out[:, back])
        cs.append(c[back])
        hs.append(h[back])
    return outs, cs, hs


def masked_scan(inputs, mask, kernels, initial_c, initial_h, cell_clip, proj_clip, resets):
    """`lstm_scan` by the mask (any mask, `resets`, autograd): every row at every step up to the last one holding a
    real token, the state carried where the mask is False (the `keras.ops` loop's rule); a step whose rows are all
    real skips the masking `where`s."""
    input_kernels, biases, recurrent_kernels, projection_kernels = kernels
    steps, batch = inputs[0].shape[0], inputs[0].shape[1]
    active = mask.any(dim=1).tolist()  # one host read of the mask: which steps hold a real token, which are full
    full = mask.all(dim=1).tolist()
    used = max((t + 1 for t, a in enumerate(active) if a), default=0)
    keep = mask[:, :, None]
    fresh = None if resets is None else [r.to(torch.bool)[:, :, None] for r in resets]
    outs, cs, hs = [], [], []
    for d, x in enumerate(inputs):
        c, h = initial_c[d], initial_h[d]
        gates = torch.addmm(biases[d], x[:used].reshape(-1, x.shape[-1]), input_kernels[d].t())
        gates = gates.view(used, batch, input_kernels[d].shape[0])
        recurrent, projection = _reordered(recurrent_kernels[d]), _reordered(projection_kernels[d])
        rows = []
        for t in range(used):
            if not active[t]:
                rows.append(None)
                continue
            if fresh is not None:
                c = torch.where(fresh[d][t], 0.0, c)
                h = torch.where(fresh[d][t], 0.0, h)
            z = _plus_times(gates[t], h, recurrent_kernels[d], recurrent)
            c_next, m = _step(z, c, projection_kernels[d], projection, cell_clip, proj_clip)
            if full[t]:
                c, h = c_next, m
                rows.append(m)
            else:
                c = torch.where(keep[t], c_next, c)
                h = torch.where(keep[t], m, h)
                rows.append(torch.where(keep[t], m, 0.0))
        outs.append(_stack(rows, steps, h))
        cs.append(c)
        hs.append(h)
    return outs, cs, hs


def _stack(rows, steps, like):
    """`(steps, batch, proj)`: `rows` (None for a step of padding only), zeros after them."""
    zero = torch.zeros_like(like)
    rows = [zero if row is None else row for row in rows]
    rows += [zero] * (steps - len(rows))
    return torch.stack(rows) if rows else torch.zeros((0, *like.shape), dtype=like.dtype, device=like.device)


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop on `lstm_scan`, reached through the door; declines what `backends.plain_float32_loop`
    refuses (the layer then runs the `keras.ops` loop)."""
    backends.plain_float32_loop(args, implementation, gate_chunk, matmul_dtype)
    return lstm_scan(*args, resets=resets)
