"""The quotient rule of r = N / sqrt(S) that both sub-pixel Newton steps use, against JAX's own derivatives."""

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core.correlation._normalised import normalised_derivatives
from napari_gridmip.core.runtime.precision import precision_scope


def test_the_derivatives_are_those_of_the_ratio():
    def numerator(p):
        y, x = p
        return 0.3 + 0.7 * y - 0.2 * x + 0.4 * y * y + 0.1 * x * y - 0.3 * x * x

    def square(p):
        y, x = p
        return 2.0 + 0.5 * y + 0.3 * x + 0.6 * y * y - 0.2 * x * y + 0.9 * x * x

    def ratio(p):
        return numerator(p) / jnp.sqrt(square(p))

    def derivatives(f, p):
        grad, hess = jax.grad(f)(p), jax.hessian(f)(p)
        return f(p), grad[0], grad[1], hess[0, 0], hess[1, 1], hess[0, 1]

    @jax.jit
    def both(p):  # one program: eager JAX ops would compile one each
        got = normalised_derivatives(derivatives(numerator, p), derivatives(square, p))
        return got, derivatives(ratio, p)

    with precision_scope(np.float64):  # x64 on, the way any JAX version spells it
        points = jnp.array([[0.1, -0.2], [0.4, 0.3], [-0.35, 0.05]], jnp.float64)
        got, want = jax.vmap(both)(points)
        assert bool(got.ok.all())
        np.testing.assert_allclose(np.stack([got.r, *got.g, *got.h]), np.stack(want), rtol=1e-12, atol=1e-12)
    flat = jax.jit(normalised_derivatives)((np.ones(2),) * 6, (np.array([0.0, -1.0]),) + (np.ones(2),) * 5)
    assert not flat.ok.any() and np.all(np.asarray(flat.r) == 0) and np.all(np.isfinite(np.asarray(flat.h)))
