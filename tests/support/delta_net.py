"""The gated delta rule of one Gated DeltaNet layer (Qwen3.5's recurrent layers),
in float64 NumPy, two ways: token by token (the recurrence itself) and in chunks
of 64 tokens, as llama.cpp's build_delta_net_chunking computes it.

Shapes (one sequence, T tokens), in the order of the GGUF file's heads:

- q, k: (T, H_k, d), already L2-normalised (:func:`l2_normalize`); q is scaled
  by 1/sqrt(d) here, as ggml_gated_delta_net and both llama.cpp graphs do;
- v: (T, H_v, d), with H_v a multiple of H_k;
- g (the log of each step's decay, <= 0), beta (the write strength, in (0, 1)): (T, H_v);
- the state: (H_v, d_k, d_v), S[h][i][j] = key channel i by value channel j.

The recurrence (ggml-cpu/ops.cpp, ggml_compute_forward_gated_delta_net_one_chunk,
which keeps S transposed, s_out[j * S_v + i] = S[i][j]), for each value head h
and token t:

    S     = exp(g[t, h]) * S
    delta = beta[t, h] * (v[t, h] - S^T k[t, h'])      # d_v: what the state mispredicts
    S     = S + k[t, h'] delta^T                        # rank-1 write: key row by delta
    o     = S^T q[t, h'] / sqrt(d)

Heads: value head h reads key (and query) head h' = h % H_k -- ggml's tiled
broadcast (``iq1 = iv1 % neq1`` in the op, ggml_repeat in llama.cpp's unfused
graphs).  Hugging Face's weights group the value heads by key head instead
(value head j of key head j // r, r = H_v / H_k), so llama.cpp's converter
(conversion/qwen.py, _LinearAttentionVReorderBase) reorders the V heads (and z,
alpha, beta, ssm_out's columns) from grouped to tiled order;
:func:`grouped_to_tiled` is that permutation.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

CHUNK = 64   # build_delta_net_chunking's chunk size for a scalar gate (16 for KDA's vector gates)


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """llama.cpp's build_gdn_l2_norm, rms_norm(x, eps / n) / sqrt(n) over the last
    axis (n wide): x / sqrt(mean(x^2) + eps/n) / sqrt(n) = x / sqrt(sum(x^2) + eps)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


def grouped_to_tiled(n_k_heads: int, n_v_per_k: int) -> np.ndarray:
    """The converter's V head reorder as an index: tiled head t is grouped head
    perm[t].  Grouped order [K0v0, K0v1, ..., K1v0, ...] (value head j reads key
    head j // n_v_per_k); tiled [K0v0, K1v0, ..., K0v1, K1v1, ...] (head t reads t % n_k_heads)."""
    return np.arange(n_k_heads * n_v_per_k).reshape(n_k_heads, n_v_per_k).T.reshape(-1)


def _check(q, k, v, g, beta, state):
    T, H_k, d = q.shape
    H_v = v.shape[1]
    assert k.shape == q.shape and v.shape == (T, H_v, d) and g.shape == beta.shape == (T, H_v)
    assert H_v % H_k == 0, "value heads must be a multiple of key heads"
    if state is None:
        state = np.zeros((H_v, d, d))
    assert state.shape == (H_v, d, d)
    return T, H_k, H_v, d, np.array(state, dtype=np.float64)


def recurrent(q, k, v, g, beta, state: Optional[np.ndarray] = None):
    """The gated delta rule token by token: (out (T, H_v, d), final state (H_v, d, d))."""
    T, H_k, H_v, d, S = _check(q, k, v, g, beta, state)
    q = np.asarray(q, dtype=np.float64) / math.sqrt(d)
    out = np.empty((T, H_v, d))
    for h in range(H_v):
        kh = h % H_k
        s = S[h]
        for t in range(T):
            s *= math.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - s.T @ k[t, kh])
            s += np.outer(k[t, kh], delta)
            out[t, h] = s.T @ q[t, kh]
    return out, S


def chunked(q, k, v, g, beta, state: Optional[np.ndarray] = None, chunk: int = CHUNK):
    """The gated delta rule in chunks of ``chunk`` tokens, as build_delta_net_chunking
    computes it: the same (out, final state) as :func:`recurrent`.

    The tokens are padded with zeros to whole chunks (a padded token has k = 0
    and g = 0: it neither writes nor decays).  Within a chunk, with G the
    cumulative sum of g (ggml_cumsum) and tokens i, j of the chunk:

    - decay[i, j] = exp(G_i - G_j) for j <= i (ggml_tri LOWER_DIAG of the exp);
    - L[i, j] = beta_i (k_i . k_j) decay[i, j] for j < i (``attn``, strictly lower);
    - T = (I + L)^-1, from the triangular solve (I + L) X = -L, T = X + I
      (ggml_solve_tri, then + identity);
    - u = T (beta v) - T (beta exp(G) k) S0: each token's delta given the chunk's
      incoming state S0 (``value`` - ``k_cumdecay`` S0 = v_new);
    - out_i = exp(G_i) S0^T q_i + sum_{j <= i} (q_i . k_j) decay[i, j] u_j
      (``attn_inter`` + ``v_attn``);
    - S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T (``g_last``, ``key_gdiff``).

    Unrolling the recurrence over a chunk gives exactly this: S after token i is
    exp(G_i) S0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T, and u_i = beta_i (v_i -
    (that state before token i's write)^T k_i) is the lower-triangular system
    (I + L) u = beta v - beta exp(G) k S0.
    """
    T, H_k, H_v, d, S = _check(q, k, v, g, beta, state)
    q = np.asarray(q, dtype=np.float64) / math.sqrt(d)
    pad = (-T) % chunk
    n_chunks = (T + pad) // chunk

    def padded(x):
        return np.concatenate([np.asarray(x, dtype=np.float64), np.zeros((pad,) + x.shape[1:])])

    q, k, v, g, beta = padded(q), padded(k), padded(v), padded(g), padded(beta)
    out = np.empty((T + pad, H_v, d))
    eye = np.eye(chunk)
    strictly_lower = np.tril(np.ones((chunk, chunk), dtype=bool), -1)
    lower = np.tril(np.ones((chunk, chunk), dtype=bool))
    for h in range(H_v):
        kh = h % H_k
        s = S[h]
        for c in range(n_chunks):
            rows = slice(c * chunk, (c + 1) * chunk)
            qc, kc, vc = q[rows, kh], k[rows, kh], v[rows, h]
            bc = beta[rows, h][:, None]
            G = np.cumsum(g[rows, h])
            decay = np.exp(np.where(lower, G[:, None] - G[None, :], -np.inf))   # 0 above the diagonal
            L = np.where(strictly_lower, (bc * kc) @ kc.T * decay, 0.0)
            solved = np.linalg.solve(eye + L, -L) + eye          # (I + L)^-1
            value = solved @ (bc * vc)
            k_cumdecay = solved @ (bc * kc * np.exp(G)[:, None])
            v_new = value - k_cumdecay @ s
            kq = np.where(lower, qc @ kc.T * decay, 0.0)
            out[rows, h] = (qc * np.exp(G)[:, None]) @ s + kq @ v_new
            s[...] = s * math.exp(G[-1]) + (kc * np.exp(G[-1] - G)[:, None]).T @ v_new
    return out[:T], S


def random_inputs(rng: np.random.Generator, T: int, H_k: int, H_v: int, d: int, eps: float = 1e-6):
    """Inputs shaped as a DeltaNet layer makes them: L2-normalised q and k, g =
    -softplus(.) * exp(.) < 0 (decays from ~0.2 to ~1 per step), beta = sigmoid(.)."""
    q = l2_normalize(rng.standard_normal((T, H_k, d)), eps)
    k = l2_normalize(rng.standard_normal((T, H_k, d)), eps)
    v = rng.standard_normal((T, H_v, d))
    g = -np.log1p(np.exp(rng.standard_normal((T, H_v)))) * np.exp(0.5 * rng.standard_normal(H_v))
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((T, H_v))))
    return q, k, v, g, beta
