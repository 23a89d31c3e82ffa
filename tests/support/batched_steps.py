"""Steps of several sequences against each sequence's own steps, bit for bit:
what every architecture's tests check of batching."""
from __future__ import annotations

import numpy as np


def assert_steps_match_solo(ctx, n_vocab: int, rng: np.random.Generator, prompt_lengths=(11, 1, 17)) -> None:
    """On a native Context holding no sequences 0-2: prompts of ``prompt_lengths``
    arriving together in one step get the logits each gets alone; then
    generated tokens of the three in one step (2, 3 and 6 rows, the small-batch
    kernels) get those of one step each."""
    prompts = [rng.integers(0, n_vocab, n).tolist() for n in prompt_lengths]
    alone = []
    for prompt in prompts:
        alone.append(ctx.decode(prompt, [0] * len(prompt))[-1])
        ctx.cache.seq_rm(0, 0)
    together = ctx.decode([t for p in prompts for t in p], [s for s, p in enumerate(prompts) for _ in p])
    for s, row in enumerate(together):
        np.testing.assert_array_equal(row, alone[s], err_msg=f"prompt {s}")
    n_seqs = len(prompts)
    bases = [ctx.cache.seq_length_of(s) for s in range(n_seqs)]
    for n in (2, 3, 6):
        tokens = rng.integers(0, n_vocab, n).tolist()
        seqs = [i % n_seqs for i in range(n)]
        one_each = np.concatenate([ctx.decode([t], [s], True) for t, s in zip(tokens, seqs)])
        for s in range(n_seqs):
            ctx.cache.seq_rm(s, bases[s])
        step = ctx.decode(tokens, seqs, True, decode_kernels=True)
        for s in range(n_seqs):
            ctx.cache.seq_rm(s, bases[s])
        np.testing.assert_array_equal(step, one_each, err_msg=f"a step of {n}")


def assert_generated_steps_match_solo(ctx, n_vocab: int, rng: np.random.Generator, widths, n_seqs: int,
                                      prompt_lengths=(3, 20)) -> None:
    """On a native Context of at least ``n_seqs`` sequences, all empty: each
    sequence gets a prompt of its own (``prompt_lengths``: the range of its
    length), then for each width a step of that many generated tokens, row i
    on sequence i % n_seqs (a stream's next token, or several of one
    stream's drafts in order), must give every row the logits of its own
    one-token step, taken in row order.  (Trims go through the Context: a
    hybrid model's recurrent state goes back to the snapshot at the prompt's end.)"""
    for s in range(n_seqs):
        prompt = rng.integers(0, n_vocab, int(rng.integers(*prompt_lengths))).tolist()
        ctx.decode(prompt, [s] * len(prompt))
    bases = [ctx.cache.seq_length_of(s) for s in range(n_seqs)]
    for n in widths:
        tokens = rng.integers(0, n_vocab, n).tolist()
        seqs = [i % n_seqs for i in range(n)]
        one_each = np.concatenate([ctx.decode([t], [s], True, decode_kernels=True) for t, s in zip(tokens, seqs)])
        for s in range(n_seqs):
            ctx.seq_rm(s, bases[s])
        step = ctx.decode(tokens, seqs, True, decode_kernels=True)
        for s in range(n_seqs):
            ctx.seq_rm(s, bases[s])
        parted = [i for i in range(n) if not np.array_equal(step[i], one_each[i])]
        assert not parted, (f"a step of {n} generated tokens ({n_seqs} sequences): rows {parted} part from their "
                            f"one-token steps, by up to {float(np.abs(step - one_each).max()):.3g}")
    for s in range(n_seqs):
        ctx.seq_rm(s, 0)
