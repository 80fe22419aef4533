"""Type-II discrete cosine transforms along the last axis, through one real FFT of the same length (Makhoul).

An FFT along the last axis is 4x faster than along another on XLA's CPU backend, so the 2D transforms work along
the last axis and transpose in between.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _complex(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.complex128 if np.dtype(dtype) == np.float64 else np.complex64)


def _order(n: int) -> np.ndarray:
    """Makhoul's reordering: the even samples, then the odd ones backwards."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)[::-1]])


def dct(x: jax.Array) -> jax.Array:
    """DCT-II of ``x`` along its last axis, unnormalised.

    ``dct(x)[k] = sum_n x[n] cos(pi k (2n + 1) / (2N))`` (half of SciPy's ``type=2, norm=None``); :func:`idct` is its
    exact inverse. Makhoul's reordering needs one real FFT of length ``n`` and two gathers, where
    ``jax.scipy.fft.dctn`` goes through an FFT of twice the length (5x ``scipy.fft.dctn``'s time on XLA's CPU
    backend, 0.45 s against 0.09 s for a 2048^2 round trip).

    References
    ----------
    J. Makhoul, "A fast cosine transform in one and two dimensions", IEEE Trans. Acoust., Speech, Signal Process.
    28(1), 27-34 (1980).
    """
    n = x.shape[-1]
    half = n // 2
    spectrum = jnp.fft.rfft(jnp.take(x, _order(n), axis=-1, mode="clip"), axis=-1)
    k = np.arange(n)
    folded = np.minimum(k, n - k)  # X[k] = Re(w_k V_k) for k <= n/2, X[n - k] = -Im(w_k V_k)
    twiddle = np.exp(-1j * np.pi * folded / (2 * n)).astype(_complex(x.dtype))
    values = jnp.take(spectrum, folded, axis=-1, mode="clip") * twiddle
    return jnp.where(k <= half, values.real, -values.imag)


def idct(coefficients: jax.Array) -> jax.Array:
    """The inverse of :func:`dct` along the last axis."""
    n = coefficients.shape[-1]
    k = np.arange(n // 2 + 1)
    low = jnp.take(coefficients, k, axis=-1, mode="clip")
    high = jnp.take(coefficients, (n - k) % n, axis=-1, mode="clip") * (k > 0)  # X[n - k], with X[n] = 0
    twiddle = np.exp(1j * np.pi * k / (2 * n)).astype(_complex(coefficients.dtype))
    samples = jnp.fft.irfft(lax.complex(low, -high) * twiddle, n=n, axis=-1)
    return jnp.take(samples, np.argsort(_order(n)), axis=-1, mode="clip")


def dct2(x: jax.Array) -> jax.Array:
    """2D DCT-II over the last two axes, returned transposed: ``(..., N, M)`` for ``(..., M, N)``."""
    return dct(jnp.swapaxes(dct(x), -1, -2))


def idct2(coefficients: jax.Array) -> jax.Array:
    """The inverse of :func:`dct2`: ``(..., N, M)`` coefficients back to ``(..., M, N)`` samples."""
    return idct(jnp.swapaxes(idct(coefficients), -1, -2))
